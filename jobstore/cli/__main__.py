from jobstore.cli import main

main()
