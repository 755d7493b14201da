"""A pytorch module for checks that never train it (tests/cli/module_study.textproto)."""


def model():
    raise NotImplementedError("only checked, never trained")


def data(rank, world):
    raise NotImplementedError("only checked, never trained")
