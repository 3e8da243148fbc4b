"""The head: the loop that turns store state into decisions and decisions into processes."""
