"""Developer tools kept beside the project; not part of the installed packages."""
