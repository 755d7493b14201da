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


def expect_terse_error(kind, fragment, fn):
    """fn() -- a backward through terse's hook -- must fail with terse's `kind`: the exception itself (torch 2.x
    re-raises a hook's own exception out of backward) or torch's RuntimeError whose message names it (torch 1.13, and
    any torch for an error set on an overlapped bucket's Future). The message must contain `fragment`; returns it."""
    try:
        fn()
    except RuntimeError as e:  # terse's exceptions are RuntimeErrors too (terse.Error)
        message = str(e)
        check(isinstance(e, kind) or kind.__name__ in message,
              "%s raised %s, neither terse.%s nor naming it: %s" % (fn, type(e).__name__, kind.__name__, message))
        check(fragment in message, "%s raised %s without %r in its message: %s" % (fn, type(e).__name__, fragment,
                                                                                    message))
        return message
    raise AssertionError("%s did not raise terse.%s (%r)" % (fn, kind.__name__, fragment))
