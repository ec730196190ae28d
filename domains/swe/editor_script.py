"""The str_replace_editor, run inside the sandbox (python3 -I -S, the call's arguments on stdin).

This module is not imported by the host: `tools.py` sends its source into the sandbox, so the
editor obeys the sandbox's limits and works the same on bubblewrap and Docker. It follows the
OpenHands / SWE-agent contract and error texts (view with `cat -n` numbering and view_range, a
directory listing two levels deep, create refusing an existing file, str_replace requiring a
unique old_str, insert after a line, undo_edit of the file's last edit). The edit history lives
in HISTORY, outside the repository, so it forks with the sandbox.

Its request comes on stdin as a Python literal (a dict of plain values, written by the host with
repr) and is read with eval under no builtins: json, base64 and hashlib would double the editor's
start-up time (~30 ms in a sandbox). It prints one line with the outcome's category ("ok" or an
error category), then the text the agent sees.
"""

import os
import sys
import zlib

HISTORY = "/.pivot/editor"
SNIPPET_LINES = 4
MAX_FILE_BYTES = 2 << 20  # larger files are refused: the agent should grep them instead
MAX_HISTORY = 10  # edits kept per file for undo_edit
MAX_LISTING = 400  # entries of a directory view
CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
    "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
    "numbers of what you are looking for.</NOTE>"
)
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
NEWLINE = "\n"  # f-strings of Python 3.11 cannot hold a backslash


class Refused(Exception):
    """A bad call: its category and the text the agent sees."""

    def __init__(self, category, text):
        super().__init__(text)
        self.category, self.text = category, text


def numbered(text, first=1):
    """Lines as `cat -n` shows them."""
    return "\n".join(f"{number:6}\t{line}" for number, line in enumerate(text.split("\n"), first))


def read_text(path):
    """A file's text (refusing binary and over-large files), line endings kept."""
    if os.path.getsize(path) > MAX_FILE_BYTES:
        raise Refused(
            "file_too_large",
            f"The file {path} is over {MAX_FILE_BYTES >> 20} MB; view parts of it with "
            "`grep -n` or `sed -n` instead.",
        )
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(
            "binary_file", f"The file {path} is a binary file; only text files can be viewed or edited."
        ) from None


def write_text(path, text):
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)


def history_dir(path):
    name = os.path.basename(path)[:100]
    return os.path.join(HISTORY, f"{zlib.crc32(path.encode('utf-8', 'surrogateescape')):08x}-{name}")


def history(folder):
    """The numbers of a file's saved versions, oldest first."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(name.split(".")[0]) for name in os.listdir(folder) if name.split(".")[0].isdigit())


def remember(path):
    """Keep the file's content before an edit (an `.absent` entry: it did not exist) for undo_edit."""
    folder = history_dir(path)
    os.makedirs(folder, exist_ok=True)
    entries = history(folder)
    for old in entries[: max(0, len(entries) - MAX_HISTORY + 1)]:
        for suffix in ("", ".absent"):
            if os.path.exists(os.path.join(folder, f"{old}{suffix}")):
                os.remove(os.path.join(folder, f"{old}{suffix}"))
    number = entries[-1] + 1 if entries else 0
    if not os.path.exists(path):
        open(os.path.join(folder, f"{number}.absent"), "wb").close()
        return
    with open(path, "rb") as source, open(os.path.join(folder, str(number)), "wb") as target:
        target.write(source.read())


def checked_path(arguments, workdir, command):
    path = arguments.get("path")
    if not isinstance(path, str) or not path:
        raise Refused("invalid_arguments", f"Parameter `path` is required for command: {command}")
    if not path.startswith("/"):
        raise Refused(
            "invalid_path",
            f"Invalid `path` parameter: {path}. The path should be an absolute path, starting with `/`.",
        )
    real, root = os.path.realpath(path), os.path.realpath(workdir)
    if real != root and not real.startswith(root + os.sep):
        raise Refused(
            "outside_repo",
            f"Invalid `path` parameter: {path}. The path is outside the repository {workdir}: "
            "only files under it can be viewed or edited.",
        )
    if command != "create" and not os.path.exists(path):
        raise Refused(
            "path_not_found",
            f"Invalid `path` parameter: {path}. The path {path} does not exist. Please provide a valid path.",
        )
    if command not in ("view", "create") and os.path.isdir(path):
        raise Refused(
            "is_directory",
            f"Invalid `path` parameter: {path}. The path {path} is a directory and only the "
            "`view` command can be used on directories.",
        )
    return path


def string_argument(arguments, name, command, default=None):
    value = arguments.get(name, default)
    if not isinstance(value, str):
        raise Refused("invalid_arguments", f"Parameter `{name}` is required for command: {command}")
    return value


def view(arguments, path):
    view_range = arguments.get("view_range")
    if os.path.isdir(path):
        if view_range is not None:
            raise Refused(
                "invalid_arguments",
                "The `view_range` parameter is not allowed when `path` points to a directory.",
            )
        found = []
        base_depth = path.rstrip("/").count("/")
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if folder.rstrip("/").count("/") - base_depth >= 2:
                dirs[:] = []
            found += [
                os.path.join(folder, name) for name in sorted([*dirs, *names]) if not name.startswith(".")
            ]
            if len(found) > MAX_LISTING:
                break
        listing = "\n".join([path, *found[:MAX_LISTING]])
        return f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{listing}\n"
    text = read_text(path)
    first = 1
    if view_range is not None:
        lines = text.split("\n")
        valid = (
            isinstance(view_range, list) and len(view_range) == 2 and all(type(n) is int for n in view_range)
        )
        if not valid:
            raise Refused(
                "invalid_arguments",
                f"Invalid `view_range` parameter: {view_range}. It should be a list of two integers.",
            )
        first, last = view_range
        if not 1 <= first <= len(lines):
            raise Refused(
                "invalid_arguments",
                f"Invalid `view_range` parameter: {view_range}. Its first element `{first}` "
                f"should be within the range of lines of the file: [1, {len(lines)}]",
            )
        if last != -1 and last < first:
            raise Refused(
                "invalid_arguments",
                f"Invalid `view_range` parameter: {view_range}. Its second element `{last}` "
                f"should be larger or equal than its first `{first}`",
            )
        if last > len(lines):
            raise Refused(
                "invalid_arguments",
                f"Invalid `view_range` parameter: {view_range}. Its second element `{last}` "
                f"should be smaller than the number of lines in the file: `{len(lines)}`",
            )
        text = "\n".join(lines[first - 1 :] if last == -1 else lines[first - 1 : last])
    return f"Here's the result of running `cat -n` on {path}:\n{numbered(text, first)}\n"


def create(arguments, path):
    text = string_argument(arguments, "file_text", "create")
    if os.path.exists(path):
        raise Refused(
            "file_exists",
            f"Invalid `path` parameter: {path}. File already exists at: {path}. "
            "Cannot overwrite files using command `create`.",
        )
    remember(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text(path, text)
    return f"File created successfully at: {path}"


def snippet(text, around, added):
    lines = text.split("\n")
    start = max(0, around - SNIPPET_LINES)
    end = min(len(lines), around + SNIPPET_LINES + added + 1)
    return numbered("\n".join(lines[start:end]), start + 1)


def str_replace(arguments, path):
    old = string_argument(arguments, "old_str", "str_replace")
    new = string_argument(arguments, "new_str", "str_replace", "")
    text = read_text(path)
    count = text.count(old) if old else 0
    if count == 0:
        raise Refused(
            "old_str_not_found",
            f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}.",
        )
    if count > 1:
        starts, at = [], text.find(old)
        while at >= 0:
            starts.append(text.count("\n", 0, at) + 1)
            at = text.find(old, at + 1)
        raise Refused(
            "old_str_not_unique",
            f"No replacement was performed. Multiple occurrences of old_str `{old}` in "
            f"lines {starts}. Please ensure it is unique.",
        )
    if old == new:
        raise Refused("no_change", "No replacement was performed. `new_str` and `old_str` must be different.")
    remember(path)
    edited = text.replace(old, new)
    write_text(path, edited)
    around = text.split(old)[0].count("\n")
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
        f"{snippet(edited, around, new.count(NEWLINE))}\n"
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )


def insert(arguments, path):
    line = arguments.get("insert_line")
    if type(line) is not int:
        raise Refused("invalid_arguments", "Parameter `insert_line` is required for command: insert")
    new = string_argument(arguments, "new_str", "insert")
    text = read_text(path)
    lines = text.split("\n")
    if not 0 <= line <= len(lines):
        raise Refused(
            "invalid_arguments",
            f"Invalid `insert_line` parameter: {line}. It should be within the range of "
            f"lines of the file: [0, {len(lines)}]",
        )
    remember(path)
    edited = "\n".join([*lines[:line], *new.split("\n"), *lines[line:]])
    write_text(path, edited)
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n"
        f"{snippet(edited, line, new.count(NEWLINE))}\n"
        "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
        "Edit the file again if necessary."
    )


def undo_edit(arguments, path):
    folder = history_dir(path)
    entries = history(folder)
    if not entries:
        raise Refused("no_history", f"No edit history found for {path}.")
    saved = os.path.join(folder, str(entries[-1]))
    if os.path.exists(saved + ".absent"):
        os.remove(saved + ".absent")
        os.remove(path)
        return f"Last edit to {path} undone successfully: the file it created is removed."
    with open(saved, "rb") as source, open(path, "wb") as target:
        target.write(source.read())
    os.remove(saved)
    return f"Last edit to {path} undone successfully. Here's the result of running `cat -n` on {path}:\n{numbered(read_text(path))}\n"


def answer(source):
    """The reply to one request (the category line, then the text)."""
    try:
        request = eval(source, {"__builtins__": {}})  # a literal the host wrote with repr
    except Exception:  # a value repr cannot write back (inf, nan): the call's arguments
        return "invalid_arguments\nThe arguments hold a value that is not plain JSON (inf, nan)."
    arguments, workdir, limit = request["arguments"], request["workdir"], request["max_bytes"]
    command = arguments.get("command")
    try:
        if command not in COMMANDS:
            raise Refused(
                "unknown_command",
                f"Unrecognized command {command}. The allowed commands for the "
                "str_replace_editor tool are: `view`, `create`, `str_replace`, `insert`, `undo_edit`",
            )
        path = checked_path(arguments, workdir, command)
        category, text = "ok", globals()[command](arguments, path)
    except Refused as refused:
        category, text = refused.category, refused.text
    except UnicodeEncodeError:
        category, text = "invalid_arguments", "The arguments are not valid Unicode text."
    except OSError as error:
        category, text = (
            "os_error",
            f"The editor could not complete `{command}` on {arguments.get('path')}: {error.strerror}",
        )
    data = text.encode("utf-8", "replace")
    if len(data) > limit:
        text = data[: limit - len(CLIPPED) - 1].decode("utf-8", "ignore") + "\n" + CLIPPED
    return f"{category}\n{text}"


def main():
    sys.stdout.write(answer(sys.stdin.read()))


def serve(folder):
    """Answer one request sent through the FIFOs in `folder`, started ahead of the call (warm_up).

    The request comes on `in` as the caller's PID, a newline and the literal; the reply goes to the
    caller's own stdout (/proc/PID/fd/1, appended), then its exit status to `done`. `in` is removed
    once read, so a later call starts an editor of its own.
    """
    with open(os.path.join(folder, "in"), encoding="utf-8", errors="surrogateescape") as fifo:
        caller, _, source = fifo.read().partition("\n")
    os.unlink(os.path.join(folder, "in"))
    status = 1
    try:
        with open(f"/proc/{int(caller)}/fd/1", "a", encoding="utf-8") as out:
            out.write(answer(source))
        status = 0
    finally:
        with open(os.path.join(folder, "done"), "w") as done:
            done.write(f"{status}\n")


if __name__ == "__main__":
    main()
