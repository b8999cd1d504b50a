from ckptlab.cli import main

main()
