"""condor_submit's file-transfer commands read into one value: what a job takes into its sandbox
on the execute node and what it brings back (should_transfer_files, transfer_input_files,
transfer_executable, transfer_output_files, when_to_transfer_output, transfer_output_remaps,
output_destination).

Names follow condor_submit: inputs are separated by commas and taken against the job's
initialdir; a directory is copied whole, or only its contents when it is named with a trailing
`/`; an output is a path inside the sandbox (never absolute, never through `..`) and comes back
under its last component, or where transfer_output_remaps sends it; with output_destination, a
URL (file, http, https), the execute node sends them there instead of into the job store."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobstore.core.jobs import InputFile
from jobstore.errors import FieldError
from jobstore.formats import remaps
from jobstore.formats.classads import string_literal
from jobstore.formats.remaps import landing
from jobstore.submit.values import FALSE_WORDS, TRUE_WORDS

__all__ = ["Input", "Transfer", "read_transfer", "sandbox_inputs", "transfer_attrs",
           "URL_SCHEMES", "parse_remaps", "output_destination"]

URL_SCHEMES = ("file", "http", "https")  # HTCondor's curl plugin's
_MODES = {"yes": True, "no": False, "if_needed": None}
_WHEN = ("on_exit", "on_exit_or_evict")


@dataclass(frozen=True)
class Input:
    """One entry of transfer_input_files (or the executable)."""

    source: str  # an absolute path on the submit machine, or a URL
    name: str  # its name at the sandbox's top ("" for a directory's contents: `dir/`)
    is_url: bool = False


@dataclass(frozen=True)
class Transfer:
    """A job's file transfer: its sandbox's inputs and the outputs it brings back."""

    inputs: tuple[Input, ...]
    executable: bool  # the executable travels with the job (transfer_executable)
    outputs: tuple[str, ...] | None  # None: every new or changed file at the sandbox's top
    remaps: tuple[tuple[str, str], ...] = ()  # output -> where it goes (transfer_output_remaps)
    on_evict: bool = False  # when_to_transfer_output = ON_EXIT_OR_EVICT
    checkpoint_exit_code: int | None = None  # the job checkpointed and wants to go on
    checkpoint_files: tuple[str, ...] | None = None  # transfer_checkpoint_files (None: outputs)
    output_url: str | None = None  # output_destination: where the node sends the outputs

    def destination(self, name: str, iwd: str) -> str:
        """Where output `name` (a path in the sandbox) lands on the submit side: its remap, or
        its last component in `iwd`."""
        for source, target in self.remaps:
            if source == name:
                return os.path.normpath(os.path.join(iwd, target))
        return os.path.join(iwd, os.path.basename(name))


def read_transfer(values: Mapping[str, str], iwd: str, *, check: bool = True
                  ) -> Transfer | None:
    """The file transfer the commands in `values` ask for (None: the job reads and writes its
    files in place, on a shared file system). FieldError names the command at fault.
    `check`: the input files must be there now (else they are read later)."""
    mode = _mode(values.get("should_transfer_files"))
    inputs_text = values.get("transfer_input_files", "").strip()
    outputs_text = values.get("transfer_output_files")
    url = values.get("output_destination", "").strip() or None
    if mode is False:
        for command in ("transfer_input_files", "transfer_output_files",
                        "transfer_output_remaps", "output_destination"):
            if values.get(command, "").strip():
                raise FieldError(command, "needs should_transfer_files = YES (it is NO)")
        return None
    if mode is None and not inputs_text and outputs_text is None and url is None:
        return None  # IF_NEEDED, or unset, with nothing to transfer: the shared file system
    when = values.get("when_to_transfer_output", "on_exit").strip().lower()
    if when not in _WHEN:
        raise FieldError("when_to_transfer_output", f"{when!r} is not ON_EXIT or ON_EXIT_OR_EVICT")
    inputs = tuple(_input(entry, iwd, check) for entry in _entries(inputs_text))
    _no_clash([i.name for i in inputs if i.name], "transfer_input_files")
    outputs = None
    if outputs_text is not None:
        outputs = tuple(_output(entry) for entry in _entries(outputs_text))
        _no_clash([os.path.basename(o) for o in outputs], "transfer_output_files")
    code = values.get("checkpoint_exit_code", "").strip()
    if code and not code.lstrip("-").isdigit():
        raise FieldError("checkpoint_exit_code", f"{code!r} is not an integer")
    checkpoint = values.get("transfer_checkpoint_files", "").strip()
    return Transfer(
        inputs=inputs,
        executable=_bool("transfer_executable", values.get("transfer_executable", "true")),
        outputs=outputs,
        remaps=_remaps(values.get("transfer_output_remaps", "")),
        on_evict=when == "on_exit_or_evict",
        checkpoint_exit_code=int(code) if code else None,
        checkpoint_files=tuple(_output(e, "transfer_checkpoint_files")
                               for e in _entries(checkpoint)) if checkpoint else None,
        output_url=_destination(url) if url else None,
    )


def _destination(url: str) -> str:
    """output_destination: a URL of a directory, by a scheme the node can send to."""
    parts = urlsplit(url)
    if parts.scheme not in URL_SCHEMES:
        why = f"the {parts.scheme}:// scheme is not supported" if parts.scheme else "not a URL"
        raise FieldError("output_destination", f"{url}: {why} (only "
                         f"{', '.join(s + '://' for s in URL_SCHEMES)})")
    if parts.scheme == "file" and (parts.netloc not in ("", "localhost")
                                   or not parts.path.startswith("/")):
        raise FieldError("output_destination", f"{url}: a file:// URL names an absolute path "
                         "on the execute node")
    if any(ord(c) < 33 or c in '"\\' for c in url):
        raise FieldError("output_destination", f"{url!r}: spaces, quotes and control "
                         "characters must be %-encoded")
    return url


def _mode(text: str | None) -> bool | None:
    if text is None:
        return None
    word = text.strip().lower()
    if word not in _MODES:
        raise FieldError("should_transfer_files", f"{text!r} is not YES, NO or IF_NEEDED")
    return _MODES[word]


def _bool(command: str, text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise FieldError(command, f"{text!r} is not true or false")


def _entries(text: str) -> list[str]:
    return [e.strip() for e in text.split(",") if e.strip()]


def _input(entry: str, iwd: str, check: bool = True) -> Input:
    what = "transfer_input_files"
    if "://" in entry:
        scheme = entry.split("://", 1)[0].lower()
        if scheme not in URL_SCHEMES:
            raise FieldError(what, f"{entry}: the {scheme}:// scheme is not supported "
                                   f"(only {', '.join(s + '://' for s in URL_SCHEMES)})")
        name = os.path.basename(urlsplit(entry).path)
        if not name or name in (".", ".."):
            raise FieldError(what, f"{entry}: the URL names no file")
        if any(c.isspace() or c in '"\\' or ord(c) < 32 for c in entry):
            raise FieldError(what, f"{entry!r}: a URL may not hold spaces, quotes or "
                                   "backslashes (encode them)")
        return Input(entry, name, is_url=True)
    path = os.path.normpath(os.path.join(iwd, entry))
    if not check:
        return Input(path, "" if entry.endswith("/") else os.path.basename(path))
    if not os.path.lexists(path):
        raise FieldError(what, f"{entry}: no such file or directory ({path})")
    if not os.access(path, os.R_OK):
        raise FieldError(what, f"{entry}: cannot be read ({path})")
    contents = entry.endswith("/") and os.path.isdir(path)
    name = "" if contents else os.path.basename(path)
    return Input(path, name)


def _output(entry: str, what: str = "transfer_output_files") -> str:
    if "://" in entry:
        raise FieldError(what, f"{entry}: an output is a file of the sandbox, not a URL "
                               "(output_destination sends outputs to a URL)")
    if os.path.isabs(entry):
        raise FieldError(what, f"{entry}: an output must be a path inside the job's sandbox, "
                               "not an absolute path")
    parts = entry.replace("\\", "/").split("/")
    if ".." in parts:
        raise FieldError(what, f"{entry}: an output may not leave the sandbox through '..'")
    name = os.path.normpath(entry)
    if name in (".", ""):
        raise FieldError(what, f"{entry}: names no file")
    return name


def _no_clash(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise FieldError(what, f"{name} is named twice")
        seen.add(name)


def parse_remaps(text: str) -> tuple[tuple[str, str], ...]:
    """transfer_output_remaps (or the job ad's TransferOutputRemaps) as (name, target) pairs;
    FieldError for a pair that is not NAME = TARGET."""
    return _remaps(text)


def _remaps(text: str) -> tuple[tuple[str, str], ...]:
    """transfer_output_remaps' pairs, each name normalised; FieldError names the command."""
    what = "transfer_output_remaps"
    try:
        pairs = remaps.parse(text)
    except remaps.RemapError as exc:
        raise FieldError(what, str(exc)) from None
    for _source, target in pairs:
        if "://" in target:
            raise FieldError(what, f"{target}: an output remapped to a URL is not supported")
    return tuple((os.path.normpath(source), target) for source, target in pairs)


def sandbox_inputs(transfer: Transfer, cmd: str, stdin_path: str | None,
                   ) -> tuple[InputFile, ...]:
    """The files a job's sandbox starts with, as the submit stores them: each input file, the
    files under each input directory (by their paths below it), the executable when it travels
    with the job, and the file named by `input` (its standard input); not the URLs, which
    PREPARE_JOB fetches on the execute node. FieldError for a name given twice (a URL's too);
    the store refuses inputs over its limits (db.sandbox)."""
    what = "transfer_input_files"
    found: list[InputFile] = []
    for entry in transfer.inputs:
        if not entry.is_url:
            found.extend(_expand(entry))
    if transfer.executable:
        found.append(InputFile(os.path.basename(cmd), cmd, _file_mode(cmd) | 0o500))
    if stdin_path and stdin_path != "/dev/null" and all(f.source != stdin_path for f in found):
        found.append(InputFile(os.path.basename(stdin_path), stdin_path, _file_mode(stdin_path)))
    names = {entry.name for entry in transfer.inputs if entry.is_url}
    for f in found:
        if f.name in names:
            raise FieldError(what, f"{f.name} would be in the sandbox twice")
        names.add(f.name)
        if any(ord(c) < 32 or c == "\x7f" for c in f.name):
            raise FieldError(what, f"{f.name!r}: a name with control characters")
        try:
            os.stat(f.source)
        except OSError as exc:
            raise FieldError(what, f"{f.source}: {exc.strerror}") from None
    return tuple(found)


def _expand(entry: Input) -> list[InputFile]:
    """A file, or the files under a directory (its name first, or only its contents)."""
    if not os.path.isdir(entry.source):
        return [InputFile(entry.name, entry.source, _file_mode(entry.source))]
    out = []
    for top, dirs, files in os.walk(entry.source):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, entry.source)
            out.append(InputFile(os.path.join(entry.name, rel) if entry.name else rel, path,
                                 _file_mode(path)))
    return out


def _file_mode(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o755
    except OSError:
        return 0o644


def transfer_attrs(transfer: Transfer, values: Mapping[str, str],
                   inputs: tuple[InputFile, ...]) -> dict[str, str]:
    """The job-ad attributes condor_submit sets for a file transfer (ClassAd expression text):
    ShouldTransferFiles, WhenToTransferOutput, TransferExecutable, TransferInput,
    TransferInputSizeMB, TransferOutput and TransferOutputRemaps; and the URLs PREPARE_JOB
    fetches (JobstoreInputUrls)."""
    out = {
        "ShouldTransferFiles": '"YES"',
        "WhenToTransferOutput": '"ON_EXIT_OR_EVICT"' if transfer.on_evict else '"ON_EXIT"',
        "TransferExecutable": "true" if transfer.executable else "false",
    }
    listed = values.get("transfer_input_files", "").strip()
    if listed:
        out["TransferInput"] = string_literal(listed)
    urls = [entry.source for entry in transfer.inputs if entry.is_url]
    if urls:  # fetched by PREPARE_JOB, in this order (jobstore.node.sandbox)
        out["JobstoreInputUrls"] = string_literal(" ".join(urls))
    size = sum(os.path.getsize(f.source) for f in inputs)
    out["TransferInputSizeMB"] = str((size + (1 << 20) - 1) >> 20)
    if transfer.outputs is not None:
        out["TransferOutput"] = string_literal(",".join(transfer.outputs))
    if transfer.checkpoint_exit_code is not None:
        out["CheckpointExitCode"] = str(transfer.checkpoint_exit_code)
    if transfer.checkpoint_files is not None:
        out["TransferCheckpoint"] = string_literal(",".join(transfer.checkpoint_files))
    if transfer.output_url:
        out["OutputDestination"] = string_literal(transfer.output_url)
    if transfer.remaps:
        out["TransferOutputRemaps"] = string_literal(remaps.render(transfer.remaps))
    return out


def output_destination(name: str, iwd: str, remaps: tuple[tuple[str, str], ...],
                       out: str | None = None, err: str | None = None,
                       listed: tuple[str, ...] = ()) -> str:
    """Where output `name` (a path in the sandbox) lands on the submit side: its remap, the
    job's `output` or `error` path for its standard output and error, else where
    `landing` puts it in `iwd` (`listed`: transfer_output_files, for the files of a
    directory it names)."""
    if name not in dict(remaps):
        for std in (out, err):
            if std and name == os.path.basename(std):
                return os.path.normpath(os.path.join(iwd, std))
    return os.path.normpath(os.path.join(iwd, landing(name, remaps, listed)))
