"""condor_submit's file-transfer commands read as condor_submit reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobstore.errors import FieldError
from jobstore.submit.transfer import Input, read_transfer


@pytest.fixture
def iwd(tmp_path: Path) -> str:
    (tmp_path / "in.txt").write_text("x")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("1")
    return str(tmp_path)


def test_no_transfer_unless_asked(iwd: str) -> None:
    assert read_transfer({}, iwd) is None
    assert read_transfer({"should_transfer_files": "IF_NEEDED"}, iwd) is None
    assert read_transfer({"should_transfer_files": "NO"}, iwd) is None
    with pytest.raises(FieldError, match="needs should_transfer_files = YES") as refused:
        read_transfer({"should_transfer_files": "no", "transfer_input_files": "in.txt"}, iwd)
    assert refused.value.what == "transfer_input_files"


def test_inputs_directories_and_their_contents(iwd: str) -> None:
    t = read_transfer({"should_transfer_files": "YES",
                       "transfer_input_files": "in.txt, data, data/ ,https://h.example/x/f.gz?v=1"},
                      iwd)
    assert t is not None
    assert t.inputs == (Input(f"{iwd}/in.txt", "in.txt"), Input(f"{iwd}/data", "data"),
                        Input(f"{iwd}/data", ""),
                        Input("https://h.example/x/f.gz?v=1", "f.gz", is_url=True))
    assert t.executable and t.outputs is None and not t.on_evict
    # transfer_input_files alone (should_transfer_files unset or IF_NEEDED) transfers too
    assert read_transfer({"transfer_input_files": "in.txt"}, iwd) is not None


@pytest.mark.parametrize(("values", "message"), [
    ({"transfer_input_files": "missing.txt"}, "missing.txt: no such file"),
    ({"transfer_input_files": "in.txt, sub/../in.txt"}, "in.txt is named twice"),
    ({"transfer_input_files": "ftp://h/f"}, "the ftp:// scheme is not supported"),
    ({"transfer_input_files": "https://h/"}, "the URL names no file"),
    ({"should_transfer_files": "sometimes"}, "is not YES, NO or IF_NEEDED"),
    ({"should_transfer_files": "yes", "when_to_transfer_output": "never"},
     "is not ON_EXIT or ON_EXIT_OR_EVICT"),
    ({"transfer_output_files": "/etc/passwd"}, "not an absolute path"),
    ({"transfer_output_files": "out/../../x"}, "may not leave the sandbox"),
    ({"transfer_output_files": "a/o.txt, b/o.txt"}, "o.txt is named twice"),
    ({"transfer_output_files": "https://h/o"}, "not a URL"),
    ({"transfer_output_files": "o", "transfer_output_remaps": '"o"'}, "is not NAME = TARGET"),
    ({"transfer_output_files": "o", "transfer_output_remaps": "o = https://h/o"},
     "remapped to a URL"),
    ({"should_transfer_files": "yes", "transfer_executable": "maybe"}, "is not true or false"),
    ({"output_destination": "s3://bucket/out"}, "the s3:// scheme is not supported"),
    ({"output_destination": "/shared/out"}, "not a URL"),
    ({"output_destination": "file://server/out"}, "names an absolute path on the execute"),
    ({"output_destination": "http://h/a b"}, "must be %-encoded"),
    ({"should_transfer_files": "NO", "output_destination": "file:///o"},
     "needs should_transfer_files = YES"),
])
def test_what_condor_submit_refuses(iwd: str, values: dict[str, str], message: str) -> None:
    with pytest.raises(FieldError, match=message):
        read_transfer(values, iwd)


def test_outputs_and_remaps(iwd: str) -> None:
    remaps = r'"out.txt = results/o\;1.txt; sub/o2.txt=/abs/o2"'
    t = read_transfer({"should_transfer_files": "YES", "transfer_executable": "false",
                       "transfer_output_files": "out.txt, sub/o2.txt",
                       "transfer_output_remaps": remaps,
                       "when_to_transfer_output": "ON_EXIT_OR_EVICT"}, iwd)
    assert t is not None and not t.executable and t.on_evict
    assert t.outputs == ("out.txt", "sub/o2.txt")
    assert t.remaps == (("out.txt", "results/o;1.txt"), ("sub/o2.txt", "/abs/o2"))
    assert t.destination("out.txt", "/home/a") == "/home/a/results/o;1.txt"
    assert t.destination("sub/o2.txt", "/home/a") == "/abs/o2"
    assert t.destination("other/x.dat", "/home/a") == "/home/a/x.dat"  # its last component


def test_urls_are_fetched_on_the_node_not_stored(iwd: str) -> None:
    from jobstore.submit.transfer import sandbox_inputs, transfer_attrs

    values = {"should_transfer_files": "YES", "transfer_executable": "false",
              "transfer_input_files": "in.txt, https://h.example/d/big.tar?x=1"}
    t = read_transfer(values, iwd)
    assert t is not None
    files = sandbox_inputs(t, "/bin/true", None)
    assert [f.name for f in files] == ["in.txt"]
    attrs = transfer_attrs(t, values, files)
    assert attrs["JobstoreInputUrls"] == '"https://h.example/d/big.tar?x=1"'
    with pytest.raises(FieldError, match="may not hold spaces"):
        read_transfer({"transfer_input_files": "http://h/a b"}, iwd)
    (Path(iwd) / "big.tar").write_text("x")
    with pytest.raises(FieldError, match="big.tar is named twice"):  # a URL's name counts
        read_transfer({**values, "transfer_input_files": values["transfer_input_files"]
                       + ", big.tar"}, iwd)


def test_output_destination_is_where_the_node_sends_the_outputs(iwd: str) -> None:
    from jobstore.submit.transfer import sandbox_inputs, transfer_attrs

    values = {"output_destination": "https://h.example/up/", "transfer_executable": "false"}
    t = read_transfer(values, iwd)  # file transfer without should_transfer_files, as HTCondor
    assert t is not None and t.output_url == "https://h.example/up/"
    attrs = transfer_attrs(t, values, sandbox_inputs(t, "/bin/true", None))
    assert attrs["OutputDestination"] == '"https://h.example/up/"'


def test_a_directory_output_lands_whole_under_its_name_or_remap() -> None:
    from jobstore.submit.transfer import output_destination

    listed = ("out.txt", "results", "deep/plots/")
    remaps = (("out.txt", "renamed.txt"), ("results", "kept"))
    land = {name: output_destination(name, "/home/a", remaps, listed=listed)
            for name in ("out.txt", "results/x/y.dat", "deep/plots/p.png", "stray/z.txt",
                         "resultsx/w.txt")}
    assert land == {"out.txt": "/home/a/renamed.txt", "results/x/y.dat": "/home/a/kept/x/y.dat",
                    "deep/plots/p.png": "/home/a/plots/p.png", "stray/z.txt": "/home/a/z.txt",
                    "resultsx/w.txt": "/home/a/w.txt"}


def test_a_listed_directory_is_sent_file_by_file(tmp_path: Path) -> None:
    from jobstore.node.sandbox import outputs

    (tmp_path / "outdir" / "sub").mkdir(parents=True)
    (tmp_path / "outdir" / "b.txt").write_text("b")
    (tmp_path / "outdir" / "sub" / "c.txt").write_text("c")
    (tmp_path / "outdir" / "link").symlink_to("/etc/passwd")
    (tmp_path / "a.txt").write_text("a")
    ad = b'TransferOutput = "a.txt, outdir"\n'
    assert outputs(ad, str(tmp_path), {}) == ["a.txt", "outdir/b.txt", "outdir/sub/c.txt"]
