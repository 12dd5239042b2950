"""One module per `criticalsvc` command; see criticalsvc.cli."""
