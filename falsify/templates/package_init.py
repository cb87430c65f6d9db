"""$package: written by `falsify init` because the package did not exist yet."""
