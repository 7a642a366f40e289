"""The documentation's examples, checked against the code: README.md and docs/*.md.

    /usr/bin/python3 check_examples.py SOURCE_DIR BUILD_DIR

Every fenced code block is found and, by its language:

* Shell (```sh, ```bash, ```console, ```shell) runs only when the line right before its fence
  is `<!-- runnable -->`: a block that can run here without network, GPU, systemd or root
  (a private daemon on a temp socket, the demo against it, gradsyncctl). It runs as printed
  with `bash -euo pipefail`, in a process group of its own, for at most 60 s, in a fresh
  folder that looks like the checkout (a link to each of its top-level entries, and `build`
  to BUILD_DIR), so that `build/bin/...` and `client/...` work while what the block writes
  stays in that folder. PATH starts with BUILD_DIR/bin; TMPDIR and HOME are private folders
  (a socket made under $(mktemp -d) collides with nothing, and stays under 108 bytes); no
  GRADSYNC_* variable of the caller's reaches it. Afterwards whatever it left running (a
  daemon started with &) is stopped with SIGTERM, then SIGKILL. Unmarked blocks are counted
  as skipped.
* C++ (```cpp, ```c++) is compiled and linked, never run: a program as printed, or, marked
  `<!-- fragment -->`, a fragment as the body of a function after the public headers
  (gradsync/c_api.h and gradsync/client.h, the in-tree API's header; the fragment's own
  #include lines go before the function). `<!-- fragment: int r, int n -->` names what the
  fragment leaves out, as the function's parameters. A source that includes the in-tree C++
  API (gradsync/client.h, options.h, tensor.h, work.h) links as the build links gradsync-demo
  (build.ninja); every source also links BUILD_DIR/lib/libgradsync_client.so, the C API as
  installed (what tests/install/check.sh builds the README's example against).
* Python (```python, ```py) is compiled (syntax), then checked in a child Python with
  BUILD_DIR/python first on sys.path: every `import gradsync...` and `from gradsync... import
  x` it makes succeeds, every attribute chain on those names (gradsync.torch.GradBuffer)
  exists, and every call of a gradsync function or class passes arguments its signature takes.
  Only gradsync's modules are imported (gradsync.torch imports torch; nothing else does).
* Other blocks (text, toml) are counted, not checked.

A marker is `<!-- runnable -->` or `<!-- fragment[: PARAMETERS] -->` alone on the line right
before a fence. An HTML comment outside code that looks like one (it starts with `runnable` or
`fragment`, or its text before any `:` is within edit distance 2 of either) but is not one
right before a fence (misspelled, or a blank line between it and the fence) is a failure: it
would silently leave its block unchecked. So is checking fewer blocks than the floors below.

A block that cannot be run or times out (each child runs in a process group of its own, killed
at its timeout) is a failure of that block, like any other. A failure prints the block's
FILE:LINE (of its opening fence, or of the comment) and the error; the exit status is 1 when
anything failed, else 0. It is 77 (skipped), saying why on one line, only when this machine
lacks what the check needs: a Ninja build (BUILD_DIR/build.ninja) or torch for this Python.
The counts per file and kind show what was covered.
"""
import ast
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SHELL = {"sh", "bash", "console", "shell"}
CPP = {"cpp", "c++"}
PYTHON = {"python", "py", "python3"}
SHELL_TIMEOUT_S = 60
CPP_TIMEOUT_S = 240
PYTHON_TIMEOUT_S = 180
# The fewest blocks a passing run checks, per kind (today's docs have exactly these). Without
# floors, deleting or misspelling the markers, or moving the examples out of the docs, would make
# this test pass having checked nothing.
MIN_SHELL_RAN = 1
MIN_CPP_COMPILED = 3
MIN_PYTHON_CHECKED = 2
# The exit status that CTest reads as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt): only
# for what the machine lacks, never for a failure.
SKIPPED = 77
# The headers of the in-tree C++ API; a source including any of them links its static library.
IN_TREE_HEADER = re.compile(r'^\s*#\s*include\s*[<"]gradsync/(client|options|tensor|work)\.h[>"]', re.M)
MARKER = re.compile(r"^<!--\s*(runnable|fragment)(?:\s*:\s*(.*?))?\s*-->$")
MARKER_WORDS = ("runnable", "fragment")
OPENING_FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*([^\s`]*)")


class Block:
    """A fenced code block: its file (relative to the source), the line of its opening fence
    (1-based), its language, its text (de-indented as far as the fence was), and its marker
    ('runnable', 'fragment' or None) with the marker's argument (a fragment's parameters)."""

    def __init__(self, path, line, lang, text, marker, marker_arg):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.marker, self.marker_arg = marker, marker_arg

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def kind(self):
        if self.lang in SHELL:
            return "shell"
        if self.lang in CPP:
            return "C++"
        if self.lang in PYTHON:
            return "Python"
        return "other"


def edit_distance(a, b):
    """Levenshtein distance: insertions, deletions and substitutions."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def looks_like_marker(text):
    """Whether an HTML comment's text (between <!-- and -->) looks meant as a marker."""
    text = text.strip().lower()
    head = text.split("\n", 1)[0].split(":", 1)[0].strip()
    return (text.startswith(MARKER_WORDS) or
            any(edit_distance(head, word) <= 2 for word in MARKER_WORDS))


def marker_problems(path, lines, prose, openings):
    """The marker-like comments of a file that mark no block. `prose` is the file's lines with
    fenced blocks blanked and inline code spans masked (`<!-- runnable -->` quoted in prose is
    no marker); `openings`, the indices of the lines that open a fence."""
    problems = []
    text = "\n".join(prose)
    for comment in re.finditer(r"<!--(.*?)(?:-->|\Z)", text, re.S):
        if not looks_like_marker(comment.group(1)):
            continue
        i = text.count("\n", 0, comment.start())
        where = f"{path}:{i + 1}"
        if not MARKER.match(lines[i].strip()) or comment.group(0) != lines[i].strip():
            problems.append(f"{where}: {comment.group(0).strip()!r} looks like a marker but is not one "
                            "(`<!-- runnable -->` or `<!-- fragment[: PARAMETERS] -->`, alone on its line): "
                            "the block it was meant for is not checked")
        elif i + 1 not in openings:
            problems.append(f"{where}: {lines[i].strip()} is not on the line right before a fence "
                            f"(line {i + 2} is {'blank' if not lines[i + 1:] or not lines[i + 1].strip() else 'not a fence'}): "
                            "it marks nothing, and the block it was meant for is not checked")
    return problems


def blocks_of(source, path):
    """The fenced blocks of one Markdown file (CommonMark fences: ``` or ~~~, possibly indented
    in a list item; a block closes at a fence of the same character at least as long), and the
    problems with its markers (see marker_problems)."""
    lines = open(os.path.join(source, path), encoding="utf-8").read().split("\n")
    # Inline code spans masked (same length, so columns hold), fenced blocks blanked below.
    prose = [re.sub(r"(`+).+?\1", lambda m: " " * len(m.group(0)), line) for line in lines]
    openings = set()
    found, i = [], 0
    while i < len(lines):
        opening = OPENING_FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        openings.add(i)
        indent, fence, lang = len(opening.group(1)), opening.group(2), opening.group(3).lower()
        before = lines[i - 1].strip() if i > 0 else ""
        marked = MARKER.match(before)
        body, j = [], i + 1
        while j < len(lines) and not re.match(r"^ *" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", lines[j]):
            # Content lines lose at most the fence's indentation, as CommonMark has it.
            body.append(re.sub(r"^ {0,%d}" % indent, "", lines[j]))
            j += 1
        found.append(Block(path, i + 1, lang, "\n".join(body) + "\n",
                           marked.group(1) if marked else None, marked.group(2) if marked else None))
        for k in range(i, min(j + 1, len(lines))):
            prose[k] = ""
        i = j + 1
    return found, marker_problems(path, lines, prose, openings)


# -- shell -------------------------------------------------------------------------------------

def group_alive(pgid):
    """Whether any process of the group is still running (a zombie is not)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def exited(pid, timeout):
    """Whether the child exited within timeout. It is not reaped: until the caller reaps it, its
    pid, the id of its process group, cannot be given to another group."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.05)
    return False


def stop_group(pgid, term_patience=10.0):
    """SIGTERM to what the block left (a daemon drains, then exits), SIGKILL after term_patience s."""
    for sig, patience in ((signal.SIGTERM, term_patience), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.1)


def run_bounded(command, timeout, input=None, **kwargs):
    """subprocess.run(command, capture_output=True, text=True) in a process group of its own:
    at the timeout (subprocess.TimeoutExpired, raised again) or any other exception, the whole
    group is stopped, not only the child, so that nothing it started outlives it."""
    child = subprocess.Popen(command, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             **kwargs)
    try:
        stdout, stderr = child.communicate(input, timeout=timeout)
    except BaseException:
        # Not reaped yet, so its pid still names its group: nothing else can have been given it.
        stop_group(child.pid, term_patience=2.0)
        child.kill()
        try:
            child.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a pipe held by something that left the group
            pass
        child.wait()
        raise
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


def checkout_like(source, build, folder):
    """Makes `folder` look like the checkout: a link per top-level entry, `build` to BUILD_DIR."""
    for entry in os.listdir(source):
        if entry not in (".git", "build"):
            os.symlink(os.path.join(source, entry), os.path.join(folder, entry))
    os.symlink(build, os.path.join(folder, "build"))


def run_shell(block, source, build, scratch):
    """Runs a runnable block; returns None when it exited 0 within the timeout, else the error."""
    folder = tempfile.mkdtemp(prefix=f"{block.line}-", dir=scratch)
    checkout_like(source, build, folder)
    private = {name: os.path.join(folder, "." + name.lower()) for name in ("TMPDIR", "HOME")}
    for path in private.values():
        os.mkdir(path, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
    env.update(private, PATH=os.path.join(build, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin"))
    script = os.path.join(folder, ".block.sh")
    with open(script, "w") as f:
        f.write(block.text)
    log_path = os.path.join(folder, ".block.log")
    # Output to a file, not a pipe: a daemon the block leaves running would hold a pipe open.
    with open(log_path, "wb") as log:
        shell = subprocess.Popen(["bash", "-euo", "pipefail", script], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            finished = exited(shell.pid, SHELL_TIMEOUT_S)
        finally:  # whatever happened, nothing the block started outlives it
            stop_group(shell.pid)
            status = shell.wait()
    error = None if finished and status == 0 else (
        f"exited with status {status}" if finished else f"timed out after {SHELL_TIMEOUT_S} s")
    with open(log_path, errors="replace") as log:
        output = log.read()
    if error is None:
        return None
    return f"{error}; its output:\n{tail(output)}" if output.strip() else f"{error}; it printed nothing"


# -- C++ ---------------------------------------------------------------------------------------

def ninja_statement(build, output_suffix):
    """The variables (FLAGS, INCLUDES, LINK_LIBRARIES, ...) of the build.ninja statement whose
    first output ends with output_suffix."""
    lines = open(os.path.join(build, "build.ninja"), encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        match = re.match(r"^build (\S+?):", line)
        if match and match.group(1).endswith(output_suffix):
            values = {}
            for var in lines[i + 1:]:
                if not var.startswith("  "):
                    break
                name, _, value = var.strip().partition(" = ")
                values[name] = value.replace("$$", "\0").replace("$ ", " ").replace("\0", "$")
            return values
    raise RuntimeError(f"{build}/build.ninja has no statement for {output_suffix} (the C++ API's link line is "
                       "taken from gradsync-demo's; a Ninja build is needed)")


def cpp_source(block):
    """The translation unit to compile: the program as printed, or the fragment wrapped. #line
    directives make the compiler's messages name the Markdown file and line."""
    first = f'#line {block.line + 1} "{block.path}"\n'
    if block.marker != "fragment":
        return first + block.text
    lines = block.text.split("\n")
    hoisted = [line for line in lines if line.lstrip().startswith("#")]
    body = ["" if line.lstrip().startswith("#") else line for line in lines]  # keeps the line numbers
    return ("#include <chrono>\n#include <cstdint>\n#include <vector>\n"
            '#include "gradsync/c_api.h"\n#include "gradsync/client.h"\n' + "\n".join(hoisted) + "\n"
            f"// {block.where}: a fragment, compiled as the body of a function; not run.\n"
            f"void gradsync_doc_example({block.marker_arg or ''}) {{\n" + first + "\n".join(body) + "\n}\n"
            "int main() {}\n")


def compile_cpp(block, source, build, scratch, in_tree_link):
    """Compiles and links one block; returns None, or the compiler's complaint."""
    stem = os.path.join(scratch, re.sub(r"\W", "_", block.where))
    text = cpp_source(block)
    with open(stem + ".cc", "w") as f:
        f.write(text)
    command = [cxx_compiler(build), "-std=c++20", "-pthread", "-I", os.path.join(source, "client", "include")]
    libraries = [os.path.join(build, "lib", "libgradsync_client.so")]
    if IN_TREE_HEADER.search(text):
        compile_vars, link_vars = in_tree_link()
        command += shlex.split(compile_vars.get("INCLUDES", "")) + shlex.split(compile_vars.get("DEFINES", ""))
        libraries += shlex.split(link_vars.get("LINK_LIBRARIES", ""))
    # In BUILD_DIR: the demo's link line names the build's own libraries relative to it.
    done = run_bounded(command + ["-o", stem, stem + ".cc"] + libraries, CPP_TIMEOUT_S, cwd=build)
    return None if done.returncode == 0 else f"does not compile and link:\n{tail(done.stdout + done.stderr)}"


def cxx_compiler(build):
    """The build's C++ compiler (CMakeCache.txt), so that its libraries link; else g++."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_CXX_COMPILER:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return "g++"


# -- Python ------------------------------------------------------------------------------------

def check_python(block, build):
    """Syntax here; the names it takes from gradsync in a child Python of its own (so that one
    block's imports do not make another's look right). Returns None or the errors."""
    try:
        compile(block.text, block.where, "exec")
    except SyntaxError as e:
        return f"syntax error at {block.path}:{block.line + (e.lineno or 1)}: {e.msg}"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(build, "python"), os.environ.get("PYTHONPATH")])))
    done = run_bounded([sys.executable, os.path.abspath(__file__), "--python-names", block.path, str(block.line)],
                       PYTHON_TIMEOUT_S, input=block.text, env=env)
    if done.returncode == 0:
        return None
    if done.stdout.strip():
        return f"uses what the gradsync package does not have:\n{tail(done.stdout)}"
    return f"could not be checked:\n{tail(done.stderr)}"


def python_names(path, fence_line, text):
    """In the child: imports what the block imports from gradsync and resolves what it uses of
    it. Prints one line per error; returns the exit status."""
    tree = ast.parse(text)
    errors = []

    def error(node, message):
        errors.append(f"{path}:{fence_line + node.lineno}: {message}")

    bound = {}  # a name the block binds by importing from gradsync -> (object, its dotted name)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in sorted(imports, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "gradsync":
                    continue
                try:
                    module = importlib.import_module(alias.name)
                except Exception as e:  # an example's import must work, whatever the reason it does not
                    error(node, f"import {alias.name}: {type(e).__name__}: {e}")
                    continue
                if alias.asname:
                    bound[alias.asname] = (module, alias.name)
                else:
                    bound["gradsync"] = (sys.modules["gradsync"], "gradsync")
        elif node.level == 0 and node.module and node.module.split(".")[0] == "gradsync":
            try:
                module = importlib.import_module(node.module)
            except Exception as e:
                error(node, f"from {node.module} import ...: {type(e).__name__}: {e}")
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        error(node, f"from {node.module} import {alias.name}: {node.module} has no {alias.name}")
                        continue
                bound[alias.asname or alias.name] = (getattr(module, alias.name), f"{node.module}.{alias.name}")

    def chain(node):
        """['gradsync', 'torch', 'GradBuffer'] for gradsync.torch.GradBuffer; None otherwise."""
        names = []
        while isinstance(node, ast.Attribute):
            names.insert(0, node.attr)
            node = node.value
        return [node.id] + names if isinstance(node, ast.Name) else None

    def resolve(node):
        """The object a gradsync name or attribute chain denotes, with its dotted name; None when
        it is not one of gradsync's, or (after reporting it) does not exist."""
        names = chain(node)
        if not names or names[0] not in bound:
            return None
        obj, dotted = bound[names[0]]
        for name in names[1:]:
            if not hasattr(obj, name):
                error(node, f"{dotted} has no attribute '{name}'")
                return None
            obj, dotted = getattr(obj, name), f"{dotted}.{name}"
        return obj, dotted

    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        # The longest chains only (gradsync.torch.GradBuffer, not also gradsync.torch), as read.
        if not isinstance(node, (ast.Attribute, ast.Name)) or id(node) in inner or not isinstance(node.ctx, ast.Load):
            continue
        found = resolve(node)
        call = calls.get(id(node))
        if not found or not call or not callable(found[0]):
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue  # *args or **kwargs: nothing to count
        try:
            signature = inspect.signature(found[0])
        except (TypeError, ValueError):
            continue
        try:
            signature.bind_partial(*[None] * len(call.args), **{k.arg: None for k in call.keywords})
        except TypeError as e:
            error(call, f"{found[1]}{signature}: {e}")
    for line in errors:
        print(line)
    return 1 if errors else 0


# -- the run -----------------------------------------------------------------------------------

def tail(text, head=15, last=25):
    """The text indented, its middle left out when long: the first lines hold a usage error,
    the last ones how it ended."""
    lines = text.rstrip("\n").split("\n")
    if len(lines) > head + last:
        lines = lines[:head] + [f"... ({len(lines) - head - last} lines left out)"] + lines[-last:]
    return "\n".join("    " + line for line in lines)


def main(argv):
    if len(argv) == 3 and argv[0] == "--python-names":
        sys.dont_write_bytecode = True
        return python_names(argv[1], int(argv[2]), sys.stdin.read())
    if len(argv) != 2:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    source, build = (os.path.abspath(a) for a in argv)
    for needed in ("bin/gradsyncd", "bin/gradsyncctl", "bin/gradsync-demo", "lib/libgradsync_client.so", "python/gradsync"):
        if not os.path.exists(os.path.join(build, needed)):
            print(f"check_examples: {build}/{needed} is missing: build first", file=sys.stderr)
            return 2
    # What this machine lacks, not what the docs get wrong: skipped (77), saying so on one line.
    missing = []
    if not os.path.exists(os.path.join(build, "build.ninja")):
        missing.append(f"{build}/build.ninja (not a Ninja build: the in-tree C++ API's link line is read from it)")
    if importlib.util.find_spec("torch") is None:
        missing.append(f"torch for {sys.executable} (gradsync.torch, which the Python examples use, imports it)")
    if missing:
        print(f"check_examples: skipped: no {' and no '.join(missing)}")
        return SKIPPED
    docs = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(source, "docs"))
                                  if f.endswith(".md"))
    link = {}

    def in_tree_link():  # read once, when a block first needs it
        if not link:
            link["vars"] = (ninja_statement(build, "gradsync-demo.dir/tools/demo.cc.o"),
                            ninja_statement(build, "bin/gradsync-demo"))
        return link["vars"]

    failures = []
    totals = {}
    # Short and private: socket paths under it must stay within 108 bytes.
    scratch = tempfile.mkdtemp(prefix="gradsync-docs-", dir="/tmp")
    try:
        for path in docs:
            counts = {}
            blocks, problems = blocks_of(source, path)
            failures += problems
            for block in blocks:
                kind, started = block.kind, time.monotonic()
                count = counts.setdefault(kind, {"found": 0, "checked": 0})
                count["found"] += 1
                if (block.marker == "runnable" and kind != "shell") or (block.marker == "fragment" and kind != "C++"):
                    failures.append(f"{block.where}: <!-- {block.marker} --> is for "
                                    f"{'shell' if block.marker == 'runnable' else 'C++'} blocks, not ```{block.lang}")
                    continue
                if kind == "shell" and block.marker == "runnable":
                    check = lambda: run_shell(block, source, build, scratch)
                elif kind == "C++":
                    check = lambda: compile_cpp(block, source, build, scratch, in_tree_link)
                elif kind == "Python":
                    check = lambda: check_python(block, build)
                else:
                    continue
                try:
                    problem = check()
                except subprocess.TimeoutExpired as e:
                    problem = f"timed out after {e.timeout:g} s"
                except RuntimeError as e:
                    problem = str(e)
                except Exception as e:  # one block's trouble is its failure, not the end of the run
                    problem = f"could not be checked: {type(e).__name__}: {e}"
                count["checked"] += 1
                print(f"{'ok  ' if problem is None else 'FAIL'} {block.where} ```{block.lang}"
                      f"{' (' + block.marker + ')' if block.marker else ''}  {time.monotonic() - started:.1f} s", flush=True)
                if problem is not None:
                    failures.append(f"{block.where}: {kind} block {problem}")
            print(f"{path}: {summary(counts)}", flush=True)
            for kind, count in counts.items():
                total = totals.setdefault(kind, {"found": 0, "checked": 0})
                total["found"] += count["found"]
                total["checked"] += count["checked"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"all: {summary(totals)}")
    checked = lambda kind: totals.get(kind, {}).get("checked", 0)
    for kind, floor, verb in (("shell", MIN_SHELL_RAN, "runnable shell blocks ran"),
                              ("C++", MIN_CPP_COMPILED, "C++ blocks compiled"),
                              ("Python", MIN_PYTHON_CHECKED, "Python blocks checked")):
        if checked(kind) < floor:
            failures.append(f"only {checked(kind)} {verb}, fewer than the floor of {floor} (MIN_* at the top of "
                            "tests/docs/check_examples.py): were markers or examples removed?")
    for failure in failures:
        print(f"\nFAILED {failure}")
    print(f"\n{len(failures)} failure(s)" if failures else "\nevery checked example holds")
    return 1 if failures else 0


def summary(counts):
    """'shell 3 found, 1 ran, 2 skipped (not marked runnable); C++ 1 found, 1 compiled and linked'."""
    done = {"shell": "ran", "C++": "compiled and linked", "Python": "compiled, gradsync names checked", "other": ""}
    parts = []
    for kind, verb in done.items():
        if kind not in counts:
            continue
        found, checked = counts[kind]["found"], counts[kind]["checked"]
        if kind == "other":
            parts.append(f"other {found} (text, toml, ...: not checked)")
        elif kind == "shell":
            parts.append(f"shell {found} found, {checked} ran, {found - checked} skipped (not marked runnable)")
        else:
            parts.append(f"{kind} {found} found, {checked} {verb}")
    return "; ".join(parts) or "no code blocks"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
