"""The tests and the code in two processes: the tests' process calls the code's functions through proxies, and only
plain data crosses between them. Standard library only; the host copies this file's text into both sandboxes beside
:mod:`hf_rollouts.sandbox.harness`, which imports it.

* The **code's process** (:func:`serve`) runs the program (the row's ``code_prefix`` and the model's code), tells the
  tests' process which names it defined, then answers calls: it looks the function up by name, calls it with the
  decoded arguments and sends back the encoded result, the exception it raised, or why the result cannot cross.
* The **tests' process** (:func:`run_split_tests`) never executes the model's code: it runs the row's
  ``code_prefix`` (the task's source: HumanEval's signatures and helpers such as ``poly``), binds a proxy for each
  function the code defined (with an entry point, the names the prefix defines stay the task's: only the entry point
  is the code's), copies the plain values it defined, runs the tests and calls ``check(<entry_point>)``.

Values cross as JSON, never pickled: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` as themselves;
``tuple``, ``dict``, ``set``, ``frozenset``, ``bytes``, ``bytearray``, ``complex``, non-finite floats and integers of
over 300 digits tagged (``{"tuple": [...]}``). Exact types only: a subclass (an ``int`` whose ``__eq__`` always says
yes), a generator or an object of the code's own class does not cross; the call then fails with that reason, and the
run fails even when a test catches the exception (the failure is recorded outside the tests' reach).

Framing: each message is an 8-byte big-endian length, then that many bytes of UTF-8 JSON. The calls' channel carries
``{"call": name, "args": [...], "kwargs": [[key, value], ...]}``; the replies' channel first ``{"ready": {name:
{"call": 1} | {"value": v} | {"module": name}}}`` or ``{"error": line}`` (the program raised), then one of
``{"value": v}``, ``{"raised": [type name, line]}``, ``{"cannot": why}`` per call.
"""

import builtins
import json
import math
import os
import sys
import traceback

MAX_MESSAGE = 64 << 20
"""Bytes of one message at most (a reply larger than this does not cross)."""
MAX_VALUES = 1 << 20
"""Bytes of the plain values the code defined at most, sent to the tests' process with its names (beyond: none)."""
PLAIN = "plain data only: None, bools, numbers, strings, bytes, lists, tuples, dicts, sets"
SAME_PROCESS_HINT = "a task whose values cannot cross needs the code verifier's option same_process"


class CannotCross(BaseException):
    """A value that is not plain data, or a reply that cannot be read. A ``BaseException``: ``except Exception`` in a
    test does not swallow it (and the run fails anyway: the first one is recorded)."""


class CodeEnded(BaseException):
    """The code's process ended, or stopped answering, during a call."""


class Escaped(BaseException):
    """A call of the code's raised ``StopIteration``, ``StopAsyncIteration`` or ``GeneratorExit``: raised again in
    the tests, it would end their ``map()``, ``filter()``, ``iter(f, s)`` or loop early, as if it were done (``all``
    then says yes). It fails the run instead, even when a test catches it."""


ESCAPING = ("StopIteration", "StopAsyncIteration", "GeneratorExit")
"""The exceptions that end the caller's iteration rather than fail it."""


def escaped(name, what):
    """The failure of a call of ``name`` that raised ``what`` (one of :data:`ESCAPING`)."""
    return Escaped(f"{name}() raised {what}, which would end the tests' iteration early; it fails the test")


def task_names(prefix, namespace, entry_point):
    """The names of the task's ``code_prefix`` that stay the task's in the tests: all it defined (its helpers, such
    as HumanEval/32's ``poly``, constants, imports) but the entry point and, without one, the functions it leaves to
    write (a body of only a docstring, ``pass`` or ``...``: the signature the code completes)."""
    import ast  # here: only a task with a prefix pays for it

    names = {name for name in namespace if not name.startswith("__")}
    if entry_point:
        return names - {entry_point}
    try:
        tree = ast.parse(prefix)
    except SyntaxError:  # it ran, so it parses; kept for safety
        return names
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and all(
            isinstance(part, ast.Pass) or (isinstance(part, ast.Expr) and isinstance(part.value, ast.Constant))
            for part in node.body
        ):
            names.discard(node.name)
    return names


def last_line(exc):
    """``Type: message`` of an exception, the message cut to one line and 300 characters."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def encode(value, depth=0):
    """``value`` as JSON-ready data (see the module docstring); :class:`CannotCross` for anything else."""
    if depth > 200:
        raise CannotCross("a value nested more than 200 deep")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:  # past ~300 digits as hex: Python refuses decimal text of over 4,300 digits
        return value if -BIG < value < BIG else {"int": hex(value)}
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is bytes or kind is bytearray:
        return {kind.__name__: value.hex()}
    if kind is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    where = "" if kind.__module__ == "builtins" else f" (from {kind.__module__})"
    raise CannotCross(f"an object of type {kind.__name__}{where}"[:200])


TAGS = {"tuple": tuple, "set": set, "frozenset": frozenset}
BIG = 1 << 1000


def decode(data, depth=0):
    """The value :func:`encode` made; :class:`CannotCross` for anything that is not its output."""
    if depth > 200:
        raise CannotCross("a value nested more than 200 deep")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is str or kind is float:
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        ((tag, inner),) = data.items()
        try:
            if tag in TAGS and type(inner) is list:
                return TAGS[tag](decode(v, depth + 1) for v in inner)
            if tag == "dict" and type(inner) is list:
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in inner}
            if tag in ("bytes", "bytearray") and type(inner) is str:
                return (bytes if tag == "bytes" else bytearray).fromhex(inner)
            if tag == "complex" and type(inner) is list and len(inner) == 2:
                real, imag = decode(inner[0], depth + 1), decode(inner[1], depth + 1)
                if type(real) is float and type(imag) is float:
                    return complex(real, imag)
            if tag == "float" and inner in ("nan", "inf", "-inf"):
                return float(inner)
            if tag == "int" and type(inner) is str:
                return int(inner, 16)
        except (TypeError, ValueError) as exc:  # an unhashable key, a malformed pair
            raise CannotCross(f"malformed {tag}: {last_line(exc)}") from None
    raise CannotCross(f"not plain data: {str(data)[:80]}")


def send(fd, message, _write=os.write, _dumps=json.dumps):
    data = _dumps(message).encode()
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[_write(fd, data) :]


def receive(fd, _read=os.read, _loads=json.loads):
    """The next message, or ``None`` at the end of the channel; :class:`CannotCross` for one past
    :data:`MAX_MESSAGE` or not JSON."""
    head = read_exactly(fd, 8, _read)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise CannotCross(f"a message of {size} bytes (more than {MAX_MESSAGE})")
    body = read_exactly(fd, size, _read)
    if body is None:
        return None
    try:
        return _loads(body)
    except (ValueError, RecursionError) as exc:
        raise CannotCross(f"a message that is not JSON: {last_line(exc)}") from None


def read_exactly(fd, size, _read=os.read):
    parts, left = [], size
    while left:
        chunk = _read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


# -- the code's process ------------------------------------------------------------------------------------------------


def serve(job, calls, replies):
    """Run the program, report its names, then answer calls until the tests' process closes the channel. Nothing
    here is trusted afterwards: the program may replace any of it, and can only make its own answers wrong."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(job["program"], "<solution>", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is its failure
        send(replies, {"error": last_line(exc)})
        return
    names, values = {}, {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if type(value).__name__ == "module":
            names[name] = {"module": value.__name__}
        elif callable(value):
            names[name] = {"call": 1}
        else:
            try:
                values[name] = {"value": encode(value)}
            except (CannotCross, RecursionError):
                pass  # a name the tests cannot use: a NameError there if they do
    try:  # plain values up to MAX_VALUES bytes in all (a table the code precomputed need not cross)
        values = values if len(json.dumps(values)) <= MAX_VALUES else {}
    except (ValueError, RecursionError):
        values = {}
    send(replies, {"ready": {**values, **names}})
    while True:
        try:
            message = receive(calls)
        except CannotCross:
            return
        if message is None:
            return
        reply = answer(namespace, message)
        try:
            sys.stdout.flush()  # what the code printed reaches the host before the tests may end the run
        except BaseException:  # noqa: BLE001, S110 - the code may have closed or replaced its streams
            pass
        try:
            send(replies, reply)
        except OSError:  # the tests' process is gone
            return
        except BaseException as exc:  # noqa: BLE001 - a reply json cannot write
            send(
                replies,
                {"cannot": f"{message.get('call')}() returned a value that cannot be written: {last_line(exc)}"},
            )


def answer(namespace, message):
    name = message.get("call")
    try:
        args = [decode(a) for a in message["args"]]
        kwargs = {k: decode(v) for k, v in message["kwargs"]}
        function = namespace[name]
    except BaseException as exc:  # noqa: BLE001
        return {"cannot": f"the call of {name!r} could not be read: {last_line(exc)}"}
    try:
        result = function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - raised in the tests' process, as it would be in one process
        return {"raised": [type(exc).__name__, last_line(exc)]}
    try:
        return {"value": encode(result)}
    except CannotCross as exc:
        return {"cannot": f"{name}() returned {exc}"}
    except RecursionError:
        return {"cannot": f"{name}() returned a value nested too deep (or containing itself)"}


# -- the tests' process ------------------------------------------------------------------------------------------------


def remote_exception(type_name, line):
    """The exception a call raised in the code's process, raised again here: a builtin exception type by its name
    (``except ValueError`` in a test works), any other as an ``Exception`` subclass of that name."""
    message = line.split(": ", 1)[1] if ": " in line else ""
    found = getattr(builtins, type_name, None)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        name = type_name if type_name.isidentifier() else "RemoteError"
        found = type(name[:100], (Exception,), {"__module__": "builtins"})
    try:
        return found(message)
    except Exception:  # noqa: BLE001 - a builtin that takes other arguments (UnicodeDecodeError)
        return RuntimeError(line)


class Proxy:
    """Stands for the code's function ``name`` in the tests' process: a call sends the arguments' plain data and
    returns the reply's. ``trouble`` keeps the first crossing failure or the code's end, which fail the run."""

    def __init__(self, name, calls, replies, trouble):
        self.__name__ = self.__qualname__ = name
        self._channel, self._trouble = (calls, replies), trouble

    def __repr__(self):
        return f"<the code's {self.__name__}>"

    def __call__(self, *args, **kwargs):
        name = self.__name__
        try:
            message = {"call": name, "args": [encode(a) for a in args]}
            message["kwargs"] = [[k, encode(v)] for k, v in kwargs.items()]
        except (CannotCross, RecursionError) as exc:
            why = f"an argument of {name}() cannot cross: {exc} ({PLAIN}); {SAME_PROCESS_HINT}"
            raise self._fail(CannotCross(why)) from None
        try:
            reply = self._exchange(message)
        except CodeEnded as exc:
            raise self._fail(exc) from None
        except BaseException as exc:  # noqa: BLE001 - not JSON, too large, too deep, not a value: no test may catch it
            raise self._fail(CannotCross(f"the reply of {name}() cannot cross: {last_line(exc)}")) from None
        if reply[0] == "value":
            return reply[1]
        if reply[0] == "raised":
            if reply[1][0] in ESCAPING:
                raise self._fail(escaped(name, reply[1][0]))
            raise remote_exception(*reply[1])
        raise self._fail(
            CannotCross(f"{reply[1]}, which cannot cross to the tests' process ({PLAIN}); {SAME_PROCESS_HINT}")
        )

    def _exchange(self, message):
        """Send the call, read its reply: ``("value", v)``, ``("raised", (type name, line))`` or ``("cannot", why)``."""
        calls, replies = self._channel
        try:
            send(calls, message)
            reply = receive(replies)
        except OSError as exc:  # BrokenPipeError: the code's process is gone
            raise CodeEnded(f"the code's process ended during a call of {self.__name__}() ({exc})") from None
        if reply is None:
            raise CodeEnded(f"the code's process ended during a call of {self.__name__}()")
        if type(reply) is dict and "value" in reply:
            return "value", decode(reply["value"])
        raised = reply.get("raised") if type(reply) is dict else None
        if type(raised) is list and len(raised) == 2:
            return "raised", (str(raised[0])[:100], str(raised[1])[:300])
        return "cannot", str(reply.get("cannot", "a reply that is not one") if type(reply) is dict else "a reply")[:300]

    def _fail(self, exc):
        if not self._trouble:
            self._trouble.append(exc)
        return exc


def run_split_tests(job, calls, replies, _exec=exec, _compile=compile, _base=BaseException):
    """The tests' side (see the module docstring): ``True``, or the failure's report. A crossing failure or the code's
    end recorded during the tests fails the run even when a test caught it."""
    trouble = []
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    tests = job["tests"]
    tests = [tests] if isinstance(tests, str) else list(tests)
    entry_point = job.get("entry_point") or None
    prefix = job.get("prefix") or ""
    try:
        _exec(_compile(prefix, "<code_prefix>", "exec"), namespace)
    except _base as exc:
        return {"passed": False, "stage": "prefix", "error": last_line(exc)}
    try:
        ready = receive(replies)
    except BaseException as exc:  # noqa: BLE001 - too large, not JSON, a broken channel: the code's failure
        return {"passed": False, "stage": "program", "error": f"its names cannot cross: {last_line(exc)}"}
    if ready is None:
        return {"passed": False, "stage": "code_ended", "error": "the code's process ended before the tests ran"}
    if type(ready) is not dict or type(ready.get("ready", ready.get("error"))) not in (dict, str):
        return {"passed": False, "stage": "program", "error": "it did not report its names"}
    if "error" in ready:
        return {"passed": False, "stage": "program", "error": str(ready["error"])[:300]}
    protected = task_names(prefix, namespace, entry_point) if prefix else set()
    bind(namespace, ready["ready"], entry_point, Proxy, calls, replies, trouble, protected)
    report = run_statements(namespace, tests, entry_point, trouble, _exec, _compile, _base)
    if trouble and isinstance(trouble[0], CodeEnded):  # the host reads how it ended
        return {**report, "stage": "code_ended", "where": report["stage"]}
    return report if report is not None else True


def bind(namespace, names, entry_point, proxy, calls, replies, trouble, task=frozenset()):
    """The code's names in the tests' namespace: a proxy per function, a copy per plain value, a module of the
    standard library imported here when the code imported it under its own name (:func:`importable`). The builtins
    stay the real ones (code that defines ``sorted`` cannot change what ``assert sorted(f(x)) == [1, 2]`` sorts
    with); so do the names of the task's prefix (``task``: :func:`task_names`, e.g. HumanEval's ``poly``), with an
    entry point or without; with an entry point ``check`` is the tests' own."""
    protected = set(dir(builtins)) | set(task) | ({"check"} if entry_point else set())
    for name, what in names.items():
        if type(name) is not str or name.startswith("__") or type(what) is not dict:
            continue
        if name in protected and name != entry_point:  # a builtin the tests use (sorted, len) stays the real one
            continue
        if "call" in what:
            namespace[name] = proxy(name, calls, replies, trouble)
        elif "value" in what:
            try:
                namespace[name] = decode(what["value"])
            except (CannotCross, RecursionError):
                continue
        elif importable(name, what.get("module")):
            try:
                namespace[name] = __import__(what["module"], fromlist=["_"])
            except Exception:  # noqa: BLE001, S112 - a name the tests cannot use
                continue


def importable(name, module):
    """A module the code imported under its own name (``import math``; not ``import math as m``), of the standard
    library: the tests' process imports it itself."""
    return type(module) is str and module.rpartition(".")[2] == name and module.split(".")[0] in sys.stdlib_module_names


def run_statements(namespace, tests, entry_point, trouble, _exec, _compile, _base):
    """The tests, then ``check(<entry_point>)``: ``None`` when all passed, else the failure's report; the first
    crossing failure (``trouble``) is reported where it happened, whatever the tests made of it."""
    for index, test in enumerate(tests):
        failed = {"passed": False, "stage": "tests", "test": index, "passed_tests": index}
        try:
            _exec(_compile(test, f"<test {index}>", "exec"), namespace)
        except _base as exc:
            return {**failed, "error": str(trouble[0])[:500] if trouble else last_line(exc)}
        if trouble:
            return {**failed, "error": str(trouble[0])[:500]}
    if entry_point is not None:
        if "check" not in namespace or not isinstance(namespace.get(entry_point), Proxy):
            return {"passed": False, "stage": "check", "error": f"NameError: check or {entry_point} is not defined"}
        try:
            namespace["check"](namespace[entry_point])
        except _base as exc:
            return {"passed": False, "stage": "check", "error": str(trouble[0])[:500] if trouble else last_line(exc)}
        if trouble:
            return {"passed": False, "stage": "check", "error": str(trouble[0])[:500]}
    return None
