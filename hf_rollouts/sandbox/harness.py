"""The program that runs *inside* the sandbox: it drops privileges, sets the limits, runs the untrusted code against the
tests and reports the outcome with a per-run secret token. Standard library only (it runs under the sandbox's own
interpreter, which need not see the project's packages); the host copies this file's text into the sandbox.

Protocol (host side: :mod:`hf_rollouts.sandbox.run`):

* ``argv[1]``: the job, a JSON file ``{"mode", "program", "tests", "entry_point", "inputs", "prefix", "uid", "limits",
  "channel"}``; ``argv[2]``: the program alone, as a file (``"io"`` mode runs it); ``argv[3]``: the source of
  :mod:`hf_rollouts.sandbox.crossing` (the tests and the code in two processes).
* stdin's first line: the token. The harness reads it and replaces stdin with ``/dev/null`` before any untrusted code
  runs, so the code cannot read it from there.
* stdout: whatever the code prints, then one line written by the harness on a copy of the original stdout:
  ``<token> PASS`` or ``<token> FAIL <json details>``. A program that exits early (``sys.exit``, ``os._exit``, a
  signal, killing its parent) or prints a fake report never produces that line: the host reads its absence as a
  failure, never as a pass.

Modes:

* ``"check"`` (the tests' process) and ``"serve"`` (the code's process): the tests and the code in two sandboxes,
  joined by the two pipes named in ``channel`` (see :mod:`hf_rollouts.sandbox.crossing`). The code's process gets no
  token and writes no report: only the tests' process, which never executes the code, reports.
* ``"tests"`` executes ``program`` then ``tests`` (Python source: HumanEval's ``def check(candidate)``, called with
  ``entry_point`` when given; or a list of statements such as ``assert f(1) == 2``, each run in turn) in one
  namespace, as HumanEval's own harness does (the verifier's ``same_process`` option).
* ``"io"`` runs ``program`` once per input (``inputs``: the cases' inputs only) as a child process with the input on
  stdin, and writes one line per case, ``<token> CASE <json>``, with what it printed; the **host** compares it with
  the expected output (:mod:`hf_rollouts.sandbox.cases`), which never enters the sandbox.

What ``"tests"`` mode cannot stop (see docs/guides/code-sandbox.md): code that walks the interpreter's frames or
memory to the report line, or returns objects whose ``__eq__`` always says yes, fools any test that runs in the same
process as the code under test; ``"check"``/``"serve"`` and ``"io"`` run the code in a separate process and have no
such gap. ``"tests"`` mode does keep the task's prefix names and the builtins for the tests, and fails a test that a
``StopIteration`` of the code's would have ended early (:func:`run_tests`).
"""

import json
import os
import resource
import sys
import traceback
import types


def set_limits(limits):
    """The per-process resource limits (inherited by every child; a process cannot raise its own hard limit)."""
    cpu = int(limits["cpu_time"])
    pairs = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
        (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in pairs:
        resource.setrlimit(which, value)


def drop_privileges(uid):
    """As real root (no user namespace), become ``uid``: the process count limit binds only non-root users, and the
    capabilities the sandbox kept for this step are cleared by the switch."""
    if uid is None:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit(f"harness: could not become uid {uid}")


def last_line(exc):
    """``Type: message`` of an exception, the message cut to one line and 300 characters."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def guard(function, name, trouble, escaping, failure, _base=BaseException):
    """``function`` (the code's), as the tests call it: ``StopIteration``, ``StopAsyncIteration`` or
    ``GeneratorExit`` out of it (``escaping``) would end the tests' ``map()``/``filter()``/``iter(f, s)`` early, as if
    done; it becomes ``failure`` instead, recorded in ``trouble`` (a test that catches it still fails)."""

    def guarded(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except escaping as exc:
            trouble.append(failure(name, type(exc).__name__))
            raise trouble[-1] from None

    for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(guarded, attribute, getattr(function, attribute))
        except _base:  # noqa: BLE001, S110 - an attribute the code made unreadable: the default stays
            pass
    guarded.__wrapped__ = function
    return guarded


def run_tests(job, crossing, _exec=exec, _compile=compile, _base=BaseException, _function=types.FunctionType):
    """Run the program, then the tests, then ``check(entry_point)``, in one process (``same_process``). Everything it
    uses after the untrusted code has run is bound before (default arguments, locals, list indexing, int
    comparison): code that replaces builtins (``exec``, ``range``, ``enumerate``) or the harness's module globals
    cannot make the tests skip. The tests run in a namespace of their own: the builtins as they were before the code
    ran, the names of the task's prefix as the prefix alone defines them (run apart first; ``crossing.task_names``),
    the code's other names, its functions guarded (:func:`guard`) against exceptions that end iteration."""
    real_builtins = dict(__builtins__.__dict__ if hasattr(__builtins__, "__dict__") else __builtins__)
    names, escaping = set(real_builtins), (StopIteration, StopAsyncIteration, GeneratorExit)
    task_names, failure = crossing.task_names, crossing.escaped
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    tests = job["tests"]
    tests = [tests] if isinstance(tests, str) else list(tests)
    count, labels = len(tests), [f"<test {i}>" for i in range(len(tests))]
    entry_point, prefix = job.get("entry_point") or None, job.get("prefix") or ""
    task, protected = {"__name__": "__main__", "__builtins__": __builtins__}, set()
    if prefix:
        try:
            _exec(_compile(prefix, "<code_prefix>", "exec"), task)
        except _base as exc:
            return {"passed": False, "stage": "prefix", "error": last_line(exc)}
        protected = task_names(prefix, task, entry_point)
    try:
        _exec(_compile(job["program"], "<solution>", "exec"), namespace)
    except _base as exc:  # everything the code raises is its failure
        return {"passed": False, "stage": "program", "error": last_line(exc)}
    trouble = []
    scope = {"__name__": "__main__", "__builtins__": real_builtins}
    for name, value in list(namespace.items()):
        if (
            type(name) is not str
            or name.startswith("__")
            or (name != entry_point and (name in names or name in protected))
        ):
            continue
        scope[name] = guard(value, name, trouble, escaping, failure) if type(value) is _function else value
    for name in protected:
        scope[name] = task[name]
    index = 0
    while index < count:
        failed = {"passed": False, "stage": "tests", "test": index, "passed_tests": index}
        try:
            _exec(_compile(tests[index], labels[index], "exec"), scope)
        except _base as exc:
            return {**failed, "error": str(trouble[0])[:500] if trouble else last_line(exc)}
        if trouble:
            return {**failed, "error": str(trouble[0])[:500]}
        index += 1
    if entry_point is not None:
        if "check" not in scope or entry_point not in scope:
            return {"passed": False, "stage": "check", "error": f"NameError: check or {entry_point} is not defined"}
        try:
            scope["check"](scope[entry_point])
        except _base as exc:
            return {"passed": False, "stage": "check", "error": str(trouble[0])[:500] if trouble else last_line(exc)}
        if trouble:
            return {"passed": False, "stage": "check", "error": str(trouble[0])[:500]}
    return True


def write_all(fd, data, _write=os.write):
    """All of ``data`` to ``fd`` (a pipe may take a large write in parts)."""
    while data:
        data = data[_write(fd, data) :]


def run_cases(job, write_record):
    """Each input in a child process (the program, ``-u``: unbuffered); its output goes to anonymous files in
    ``/tmp`` (bounded by the tmpfs and the file size limit), of which at most ``output_bytes`` are read back. The
    expected outputs are not here (the host compares, :mod:`hf_rollouts.sandbox.cases`): each case's outcome is
    handed to ``write_record`` as ``{"test", "stdout" (base64), "error", "tail"}``; the host stops the run at the
    first wrong one."""
    import base64  # here: the other modes' processes start without them
    import subprocess
    import tempfile

    path, limit = sys.argv[2], int(job["limits"]["output_bytes"])
    timeout = max(0.1, float(job["limits"]["case_time"]))
    for index, given in enumerate(job["inputs"]):
        record = {"test": index, "stdout": None, "error": None, "tail": ""}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                done = subprocess.run(
                    [sys.executable, "-I", "-B", "-u", path],
                    input=str(given).encode(),
                    stdout=out,
                    stderr=err,
                    timeout=timeout,
                )
                returncode = done.returncode
            except subprocess.TimeoutExpired:
                returncode = None
            size = out.seek(0, 2)
            out.seek(0)
            err.seek(max(0, err.seek(0, 2) - 1024))
            stdout, stderr = out.read(limit + 1), err.read(1024).decode(errors="replace")
        record["tail"] = (stdout[-1024:].decode(errors="replace") + stderr)[-2048:]
        if returncode is None or returncode == -24:  # the wall limit, or SIGXCPU: the CPU-time limit (RLIMIT_CPU)
            record["error"] = "timeout"
        elif returncode != 0:
            lines = stderr.strip().splitlines()
            record["error"] = lines[-1][:300] if lines else f"exit status {returncode}"
        elif size > limit:
            record["error"] = f"output limit: printed more than {limit} bytes"
        else:
            record["stdout"] = base64.b64encode(stdout).decode()
        write_record(record)
    return True


def load_crossing(path):
    """The module :mod:`hf_rollouts.sandbox.crossing` from its source (a memory file: no directory to import from)."""
    module = types.ModuleType("crossing")
    with open(path) as f:
        exec(compile(f.read(), "crossing.py", "exec"), module.__dict__)
    sys.modules["crossing"] = module
    return module


def serve(crossing, job):
    """The code's process: answer the tests' calls until they close the channel, then exit at once."""
    try:
        crossing.serve(job, *job["channel"])
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001, S110 - the code may have closed or replaced its streams
            pass
        os._exit(0)


def main():
    token = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    report_fd = os.dup(1)
    os.set_inheritable(report_fd, False)
    with open(sys.argv[1]) as f:
        job = json.load(f)
    drop_privileges(job.get("uid"))
    set_limits(job["limits"])
    crossing = load_crossing(sys.argv[3]) if job["mode"] != "io" else None
    if job["mode"] == "serve":  # the code's process: no report of its own
        serve(crossing, job)
    # the pass line is made before any untrusted code runs; a failure line always starts with FAIL, whatever a
    # replaced json module writes after it (the host counts only this exact PASS line as a pass)
    pass_line = (token + " PASS\n").encode()
    fail_prefix = token + " FAIL "
    write, flush_out, flush_err, exit_now, dumps, encode = (
        os.write,
        sys.stdout.flush,
        sys.stderr.flush,
        os._exit,
        json.dumps,
        str.encode,
    )
    if job["mode"] == "check":
        outcome = crossing.run_split_tests(job, *job["channel"])
    elif job["mode"] == "io":
        case_prefix = token + " CASE "
        outcome = run_cases(job, lambda record: write_all(report_fd, encode(case_prefix + dumps(record) + "\n")))
    else:
        outcome = run_tests(job, crossing)
    try:
        flush_out()
        flush_err()
    except BaseException:  # noqa: BLE001, S110 - the code may have closed or replaced its streams
        pass
    if outcome is True:
        write(report_fd, pass_line)
    else:
        try:
            detail = dumps(outcome)
        except BaseException:  # noqa: BLE001 - a replaced json module: the failure stands, without its details
            detail = "{}"
        write(report_fd, encode(fail_prefix + detail + "\n"))
    exit_now(0)  # skips what the code registered to run at exit (atexit, finalizers, threads)


if __name__ == "__main__":
    main()
