from clustertrain.cli import main

main()
