from geneva_drive.cli import main

main()
