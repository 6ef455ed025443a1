from jobstore.cli.commands import main

main()
