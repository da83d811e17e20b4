"""A gang-scheduling queue dispatcher for Kubernetes AppWrappers."""

from importlib import metadata

#: The distribution's name on the package index (`dispatcher` there is an unrelated
#: project); the import package and the command are `dispatcher`.
DISTRIBUTION = "appwrapper-dispatcher"


def version() -> str:
    """The installed distribution's version; "unknown" from sources that are not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
