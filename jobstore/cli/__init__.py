"""The `jobstore` command. Its executable starts in jobstore.cli.front (standard library only);
the commands themselves are in jobstore.cli.commands."""


def main() -> None:
    """The `jobstore` executable: this account's command server runs the command when one is up
    (jobstore.cli.front), else this process, which then leaves one behind."""
    from jobstore.cli import front

    path = front.hand_over()
    from jobstore.cli.commands import main as commands

    try:
        commands(prog_name="jobstore")
    finally:
        if path is not None:
            front.start_server(path)


__all__ = ["main"]
