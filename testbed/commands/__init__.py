"""The `testbed` subcommands: run, sweep, audit, labs, cli (explore), clean, and their argument parser."""
