"""Task modules that the acceptance tests' worker subprocesses load as ``module:attribute``."""
