"""One module per stage; each takes an Artifact (or a path) and returns a new Artifact."""
