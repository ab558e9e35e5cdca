"""Data files: reading and checking the training and embedding inputs."""
