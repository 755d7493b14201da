"""The assertions tests/python's scripts share (plain functions: the scripts run as programs, not under a runner)."""


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def expect_error(kind, fragment, fn):
    """fn() must raise `kind` whose message contains `fragment`; returns the message."""
    try:
        fn()
    except kind as e:
        check(fragment in str(e), "%s raised %s without %r in its message: %s" % (fn, kind.__name__, fragment, e))
        return str(e)
    raise AssertionError("%s did not raise %s (%r)" % (fn, kind.__name__, fragment))
