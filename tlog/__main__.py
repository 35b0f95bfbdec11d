from tlog.cli import main

main()
