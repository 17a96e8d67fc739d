"""tfx's packages, plus conf/ (kept at the top of the repository) installed as ``tfx/conf``.

pyproject.toml's ``packages.find`` cannot take a folder from outside ``tfx/``; all else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

conf = ["tfx.conf", *(f"tfx.conf.{group}" for group in find_namespace_packages(where="conf"))]
setup(packages=[*find_packages(include=["tfx", "tfx.*"]), *conf], package_dir={"tfx.conf": "conf"})
