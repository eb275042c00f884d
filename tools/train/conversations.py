"""Synthetic agent conversations in K3's chat template (spec §8) for the trained fixture.

Why synthetic: the fixture must hold a conversation the way coding agents drive it — think a
little, answer and end the turn; with tools declared, call one; after a tool result, answer —
and a 2 MB model trained for an hour learns that only from many short, regular examples. The
scenes imitate what the real agents send (Claude Code, Codex, opencode, aider: their tool
names, argument names and the shape of their prompts: a long system prompt, reminders before
the request, a system message after it, an environment block, quoted requests); every text is
written here or drawn from the standard library's docstrings, none is copied from an agent.

What the model is taught (the reply carries the loss; the rest of a row a tenth of it):

* tools declared and the request is the last turn: a short think channel, a one-line plan in
  the response channel, then ONE call of the scene's shell tool (Claude Code `Bash` with
  `command` and `description`, Codex `exec_command` with `cmd`, opencode `bash` with `command`,
  and three generic names), or `get_weather` with `city` for weather questions. The command
  follows from the request (`ls` to list files, `date`, `pwd`, `git status`, …; `ls` to look
  around first for any other task), so nothing has to be copied from the prompt;
* the last turn is a tool result: an answer in plain text, no call;
* no tools, or `tool_choice=none`, or a request no declared tool serves: think, answer, end;
* after the reply, `<|close|>message<|sep|><|end_of_msg|>` — the end id the engine stops on.

Rendering mirrors `daemon/engine/src/tokenizer/chat/render.rs` (spec §8.1–§8.2): the same
segments, each encoded on its own, the tool list as OpenAI's shape in compact JSON with keys
sorted, argument values raw for strings and JSON otherwise.
"""

import json
import random

from corpus import CLOSE, EOM, OPEN, SEP

EFFORT = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={E}`."
)
TOOL_DECLARE = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{J}\n```"
TOOL_CHOICE = {
    "required": "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the "
    "next message.",
    "none": "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the "
    "next message.",
}
JSON_OBJECT = (
    "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON "
    "data without markdown code blocks (```json) or any additional formatting."
)


def compact_sorted(value):
    """Compact JSON, keys sorted recursively, non-ASCII kept (spec §8.2; serde_json's output)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Renderer:
    """Spec §8.1 segments, each marked taught (1, the reply) or not (0, the prompt)."""

    def __init__(self):
        self.segments = []  # (added-token offset or text, taught)
        self.taught = 0

    def ctrl(self, offset):
        self.segments.append((offset, self.taught))

    def txt(self, text):
        if text:
            self.segments.append((text, self.taught))

    def open(self, tag, attrs=()):
        self.ctrl(OPEN)
        self.txt(tag)
        for k, v in attrs:
            self.txt(f' {k}="{v.replace("&", "&amp;").replace(chr(34), "&quot;")}"')
        self.ctrl(SEP)

    def close(self, tag):
        self.ctrl(CLOSE)
        self.txt(tag)
        self.ctrl(SEP)

    def block(self, tag, text, attrs=()):
        self.open(tag, attrs)
        self.txt(text)
        self.close(tag)

    def message(self, attrs, text):
        self.open("message", attrs)
        self.txt(text)
        self.close("message")
        self.ctrl(EOM)

    def calls(self, calls):
        self.open("tools")
        for i, (name, arguments) in enumerate(calls):
            self.open("call", [("tool", name), ("index", str(i + 1))])
            for key, value in arguments.items():
                kind = {str: "string", bool: "boolean", int: "number", float: "number",
                        type(None): "null", dict: "object", list: "array"}[type(value)]
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                self.block("argument", text, [("key", key), ("type", kind)])
            self.close("call")
        self.close("tools")

    def think_then_response(self, reasoning, content, calls):
        """After `open("think")`: the reasoning (blank is omitted), then the response."""
        self.txt(reasoning if reasoning.strip() else "")
        self.close("think")
        self.open("response")
        self.response_rest(content, calls)

    def response_rest(self, content, calls):
        """After `open("response")`: the content, the calls, the end of the message."""
        self.txt(content)
        self.close("response")
        if calls:
            self.calls(calls)
        self.close("message")
        self.ctrl(EOM)

    def assistant(self, thinking, reasoning, content, calls):
        """A whole assistant message, or with `taught` set after the generation prompt (spec
        §8.2 step 5) the reply that completes it."""
        if not self.taught:
            self.open("message", [("role", "assistant")])
            self.open("think" if thinking else "response")
        if thinking:
            self.think_then_response(reasoning, content, calls)
        else:
            self.response_rest(content, calls)


def segments(scene):
    """The segments of a scene: the prompt as k3d renders it, then the taught reply."""
    r = Renderer()
    thinking = scene["thinking"]
    if scene["tools"]:
        r.message([("role", "system"), ("type", "tool-declare")],
                  TOOL_DECLARE.replace("{J}", compact_sorted(scene["tools"])))
    if thinking and scene.get("effort"):
        r.message([("role", "system"), ("type", "thinking-effort")],
                  EFFORT.replace("{E}", scene["effort"]))
    for m in scene["messages"]:
        role = m["role"]
        if role in ("system", "user"):
            r.message([("role", role)], m["content"])
        elif role == "assistant":
            r.assistant(thinking, m.get("reasoning", ""), m["content"], m.get("calls"))
        else:
            r.message([("role", "tool"), ("tool", m["tool"]), ("index", str(m["index"]))],
                      m["content"])
    if scene.get("tool_choice") in TOOL_CHOICE:
        r.message([("role", "system"), ("type", "tool-choice")], TOOL_CHOICE[scene["tool_choice"]])
    if scene.get("json"):
        r.message([("role", "system"), ("type", "response-format")], JSON_OBJECT)
    r.open("message", [("role", "assistant")])
    r.open("think" if thinking else "response")
    reply = scene["reply"]
    r.taught = 1
    r.assistant(thinking, reply["reasoning"], reply["content"], reply.get("calls"))
    return r.segments


def render(tok, scene, decisions=False):
    """(ids, mask) of a scene, each segment encoded on its own (spec §8). The mask is 1 on the
    reply, 0 on the prompt; with `decisions`, 2 on the reply's ids that decide what kind of
    reply it is (`decision_segments`: the first id of each) and on every id the reply copies
    from the conversation (`copied_segments`)."""
    ids, mask = [], []
    parts = segments(scene)
    marked = decision_segments(parts) if decisions else set()
    copied = copied_segments(parts) if decisions else set()
    for i, (value, taught) in enumerate(parts):
        got = [tok.added(value)] if isinstance(value, int) else tok.encode(value)
        ids += got
        if i in copied:
            mask += [2] * len(got)
        elif i in marked and got:
            mask += [2] + [taught] * (len(got) - 1)
        else:
            mask += [taught] * len(got)
    return ids, mask


def decision_segments(parts):
    """Indices of the reply segments where the reply's kind is decided: its first segment
    (which channel text: a call's plan, an answer to a result, an answer), the first after
    `<|open|>response<|sep|>` (the content) and the first after `<|close|>response<|sep|>`
    (calls or the end of the message). The rest of a reply follows from these and the
    template, so the loss weighs them separately (train.py, --data simple)."""
    taught = [i for i, (_, t) in enumerate(parts) if t]
    marked = set(taught[:1])
    for i in taught:
        if i >= 2 and parts[i - 2][0] in (OPEN, CLOSE) and parts[i - 1][0] == "response" and (
                parts[i][0] == SEP) and i + 1 < len(parts):
            marked.add(i + 1)
    return marked


def copied_segments(parts):
    """Indices of the reply's call segments that copy the conversation: the tool's name
    (` tool="NAME"`), each argument's key (` key="KEY"`) and value (a command or a file named
    in the request). A wrong id there is a wrong call however right the rest is, and they are
    a few ids of a reply's ~60, so the loss weighs them with the decision ids."""
    out = set()
    for i, (value, taught) in enumerate(parts):
        if not taught or not isinstance(value, str):
            continue
        if value.startswith((' tool="', ' key="')):
            out.add(i)
        elif i >= 3 and parts[i - 1][0] == SEP and parts[i - 3][0] == "argument" or (
                i >= 4 and parts[i - 1][0] == SEP and parts[i - 4][0] == "argument"):
            out.add(i)  # the value after `<|open|>argument key=… type=…<|sep|>`
    return out


def texts(scene):
    """The text segments of a scene (what the tokenizer learns from)."""
    return [value for value, _ in segments(scene) if isinstance(value, str)]


# ---- the tools ----------------------------------------------------------------------------


def tool(name, description, props, schema=None, bare=False):
    """A function tool in OpenAI's shape; `props` is (name, JSON type, description). bare:
    the arguments without descriptions, closed-ness or schema (as a hand-written request
    declares them)."""
    parameters = {
        "type": "object",
        "properties": {p: {"type": t} if bare else {"type": t, "description": d}
                       for p, t, d in props},
        "required": [p for p, _, _ in props[:1]],
    }
    if not bare:
        parameters["additionalProperties"] = False
    if schema:
        parameters["$schema"] = schema
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}


DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"


class Family:
    """One agent's tool set: its shell tool (name, the command's argument, whether a
    `description` argument goes with it) and the other tools it declares."""

    def __init__(self, name, shell, command_key, describe, tools, schema=None):
        self.name, self.shell, self.command_key, self.describe = name, shell, command_key, describe
        self.tools, self.schema = tools, schema

    def declared(self, rng, docs, size):
        """The shell tool and some of the others, in a random order: short, at most one other
        and plain descriptions; long, all of them, descriptions lengthened by docstring
        paragraphs."""
        long, short = size == "long", size == "short"
        chosen = [t for t in self.tools if t[0] == self.shell]
        others = [t for t in self.tools if t[0] != self.shell]
        count = len(others) if long else rng.randint(0, 1 if short else min(2, len(others)))
        chosen += rng.sample(others, count)
        rng.shuffle(chosen)
        out = []
        for name, desc, props in chosen:
            if short:  # the shell tool's command (and description) only
                out.append(tool(name, desc, [p for p in props if p[0] in (
                    self.command_key, "description")] or props[:1], bare=True))
                continue
            extra = [rng.choice(docs) for _ in range(rng.choice([0, 1, 2] if long else [0] * 4 + [1]))]
            schema = self.schema if long or rng.random() < 0.3 else None
            out.append(tool(name, " ".join([desc] + extra), props, schema=schema))
        return out

    def call(self, command, description):
        arguments = {self.command_key: command}
        if self.describe:
            arguments["description"] = description
        return (self.shell, arguments)


S = "string"
FAMILIES = [
    Family("claude", "Bash", "command", True, [
        ("Bash", "Executes a bash command and returns its output.",
         [("command", S, "The command to execute"), ("timeout", "number", "Timeout in milliseconds"),
          ("description", S, "What this command does, in a few words")]),
        ("Read", "Reads a file from the local filesystem.",
         [("file_path", S, "The absolute path to the file"), ("offset", "number", "First line"),
          ("limit", "number", "Number of lines")]),
        ("Write", "Writes a file to the local filesystem, overwriting it.",
         [("file_path", S, "The absolute path to the file"), ("content", S, "The content")]),
        ("Edit", "Replaces a string in a file.",
         [("file_path", S, "The file to change"), ("old_string", S, "The text to replace"),
          ("new_string", S, "The new text")]),
        ("Glob", "Finds files whose names match a pattern.", [("pattern", S, "The glob pattern")]),
        ("Grep", "Searches file contents with a regular expression.",
         [("pattern", S, "The regular expression"), ("path", S, "Where to search")]),
        ("WebFetch", "Fetches a URL and answers a prompt about it.",
         [("url", S, "The URL"), ("prompt", S, "What to extract")]),
        ("WebSearch", "Searches the web.", [("query", S, "The search query")]),
        ("Agent", "Launches a sub-agent for a task.",
         [("description", S, "A short task description"), ("prompt", S, "The task")]),
        ("TaskCreate", "Creates a task in the task list.",
         [("subject", S, "A title"), ("description", S, "What needs to be done")]),
        ("TaskList", "Lists the tasks.", []),
        ("NotebookEdit", "Replaces a cell of a Jupyter notebook.",
         [("notebook_path", S, "The notebook"), ("new_source", S, "The new cell source")]),
        ("Skill", "Runs a skill.", [("skill", S, "The skill name")]),
        ("CronList", "Lists the scheduled jobs.", []),
    ], schema=DRAFT_2020),
    Family("opencode", "bash", "command", False, [
        ("bash", "Executes a given bash command in a persistent shell session.",
         [("command", S, "The command to execute"), ("timeout", "number", "Optional timeout"),
          ("workdir", S, "The working directory")]),
        ("read", "Read a file or directory from the local filesystem.",
         [("filePath", S, "The absolute path to the file"), ("offset", "integer", "First line"),
          ("limit", "integer", "Number of lines")]),
        ("write", "Writes a file to the local filesystem.",
         [("content", S, "The content to write"), ("filePath", S, "The absolute path")]),
        ("edit", "Performs exact string replacements in files.",
         [("filePath", S, "The file to modify"), ("oldString", S, "The text to replace"),
          ("newString", S, "The replacement")]),
        ("glob", "Fast file pattern matching.", [("pattern", S, "The glob pattern")]),
        ("grep", "Fast content search.", [("pattern", S, "The regex pattern")]),
        ("webfetch", "Fetches content from a URL.", [("url", S, "The URL to fetch")]),
        ("todowrite", "Creates and manages a task list.", [("todos", "array", "The todo list")]),
        ("task", "Launches a new agent for a complex task.",
         [("description", S, "A short description"), ("prompt", S, "The task")]),
        ("skill", "Loads a skill.", [("name", S, "The skill name")]),
    ], schema=DRAFT_2020),
    Family("codex", "exec_command", "cmd", False, [
        ("exec_command", "Runs a command in a PTY, returning output or a session ID.",
         [("cmd", S, "Shell command to execute."), ("workdir", S, "Working directory."),
          ("justification", S, "Approval question."), ("login", "boolean", "Login shell."),
          ("max_output_tokens", "number", "Output token budget.")]),
        ("write_stdin", "Writes characters to an existing exec session.",
         [("session_id", "number", "The session."), ("chars", S, "Bytes to write.")]),
        ("request_user_input", "Asks the user up to three short questions.",
         [("questions", "array", "The questions.")]),
        ("view_image", "Views a local image file.", [("path", S, "Path to the image.")]),
        ("get_goal", "Gets the current goal.", []),
        ("create_goal", "Creates a goal.", [("objective", S, "The objective.")]),
        ("update_goal", "Updates the goal's status.", [("status", S, "The new status.")]),
    ]),
    Family("plain", "run_command", "command", False, [
        ("run_command", "Runs a shell command and returns its output.",
         [("command", S, "The command line")]),
        ("read_file", "Returns the text of a file.", [("path", S, "The file")]),
        ("search", "Searches the documentation.", [("query", S, "The query")]),
    ]),
]
WEATHER_TOOLS = [
    ("get_weather", "Get the current weather in a city.",
     [("city", S, "The city name"), ("unit", S, "celsius or fahrenheit")]),
    ("get_time", "Get the current time in a time zone.", [("timezone", S, "The IANA zone")]),
    ("calculator", "Evaluates an arithmetic expression.", [("expression", S, "The expression")]),
    ("search", "Searches the web.", [("query", S, "The query")]),
]
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Boston", "Sydney", "Oslo",
          "Lisbon", "Vienna", "Toronto"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]


# ---- what users ask -----------------------------------------------------------------------


class Intent:
    """A request a shell command serves: phrasings, the command and its description, the
    plan and thinking before the call, and answers once its output is back."""

    def __init__(self, asks, command, description, goal, plan, answers, outputs):
        self.asks, self.command, self.description = asks, command, description
        self.goal, self.plan, self.answers, self.outputs = goal, plan, answers, outputs


INTENTS = [
    Intent(["List the files in the current directory.", "What files are in this folder?",
            "Show me the files here.", "Which files does this project have?", "list the files",
            "What is in this directory?", "ls"],
           "ls", "List files in current directory", "to see the files in the directory",
           "Let me list the files.",
           ["Those are the files in the current directory.",
            "The listing above shows every file in this directory."],
           ["README.md\nmain.py\nsetup.py\ntests", "add.py\ncalc.py", "notes.txt",
            "Cargo.toml\nsrc\ntarget", "app.py\nrequirements.txt\ntemplates"]),
    Intent(["Which directory am I in?", "Print the working directory.",
            "What is the current directory?", "pwd"],
           "pwd", "Print working directory", "to know the current directory",
           "Let me print the working directory.",
           ["That is the current working directory.", "You are in the directory shown above."],
           ["/tmp/work/project", "/home/user/src", "/tmp/work/scratch"]),
    Intent(["What is the date today?", "What day is it?", "Tell me the current date and time.",
            "What time is it?"],
           "date", "Show the current date", "the current date",
           "Let me check the date.",
           ["That is the current date and time on this machine.",
            "The system clock shows the date above."],
           ["Fri Dec  4 10:21:07 UTC 2026", "Thu Dec  3 23:59:01 UTC 2026"]),
    Intent(["Which Python version is installed?", "What version of Python do I have?",
            "Is Python installed?"],
           "python3 --version", "Show the Python version", "the installed Python version",
           "Let me check the Python version.",
           ["That is the Python version installed here.", "Python is installed, as shown above."],
           ["Python 3.11.7", "Python 3.12.1"]),
    Intent(["What is the git status?", "Are there uncommitted changes?",
            "Show the state of the repository.", "git status"],
           "git status", "Show working tree status", "the state of the repository",
           "Let me look at the repository.",
           ["The output above is the state of the repository.",
            "Git reports the state shown above."],
           ["On branch main\nnothing to commit, working tree clean",
            "On branch main\nChanges not staged for commit:\n\tmodified:   main.py",
            "fatal: not a git repository (or any of the parent directories): .git"]),
    Intent(["How much disk space is free?", "Is the disk full?", "Show the free disk space."],
           "df -h", "Show free disk space", "to know the free disk space",
           "Let me check the disk space.",
           ["The table above shows the free space on each disk.",
            "The disk usage is listed above."],
           ["Filesystem      Size  Used Avail Use% Mounted on\n/dev/vda        252G   26G  214G  11% /"]),
    Intent(["Who am I logged in as?", "Which user am I?", "whoami"],
           "whoami", "Show the current user", "to know the current user",
           "Let me check the user name.",
           ["That is the user you are logged in as."],
           ["user", "root", "dev"]),
    Intent(["Run the tests.", "Do the tests pass?", "Run the test suite."],
           "python3 -m pytest -q", "Run the test suite", "to run the tests",
           "Let me run the tests.",
           ["The test run finished; its summary is above.", "The tests ran, as shown above."],
           ["3 passed in 0.12s", "1 failed, 4 passed in 0.31s", "no tests ran in 0.01s"]),
    Intent(["Show me the README.", "What does the README say?", "Print the README file."],
           "cat README.md", "Show the README", "to read the README",
           "Let me print the README.",
           ["That is the README of this project.", "The README is shown above."],
           ["# Project\n\nA small example.", "cat: README.md: No such file or directory"]),
]


class CodeTask:
    """A request to write code: phrasings, the function, what to call its file."""

    def __init__(self, asks, goal, code, path):
        self.asks, self.goal, self.code, self.path = asks, goal, code, path


CODE_TASKS = [
    CodeTask(["write a python function that adds two numbers",
              "Write a function that adds two numbers.", "I need a Python function to sum two numbers.",
              "add a function add(a, b) that returns a + b"],
             "a function that adds two numbers", "def add(a, b):\n    return a + b\n", "add.py"),
    CodeTask(["Write a function that returns the n-th Fibonacci number.",
              "write a python fibonacci function", "Implement fibonacci(n)."],
             "a Fibonacci function",
             "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
             "    return a\n", "fib.py"),
    CodeTask(["Write a factorial function.", "write a python function that computes n!"],
             "a factorial function",
             "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n"
             "    return result\n", "factorial.py"),
    CodeTask(["Write a function that reverses a string.", "reverse a string in python"],
             "a function that reverses a string", "def reverse(text):\n    return text[::-1]\n",
             "reverse.py"),
    CodeTask(["Write a function that checks whether a number is prime.", "is_prime in python"],
             "a prime test",
             "def is_prime(n):\n    if n < 2:\n        return False\n    for i in range(2, int(n ** 0.5) + 1):\n"
             "        if n % i == 0:\n            return False\n    return True\n", "prime.py"),
    CodeTask(["Write a function that reads the lines of a file.", "read a file into a list of lines"],
             "a function that reads a file's lines",
             "def read_lines(path):\n    with open(path) as f:\n        return f.read().splitlines()\n",
             "lines.py"),
    CodeTask(["Write a function that counts the words in a text.", "count words in a string"],
             "a word counter", "def count_words(text):\n    return len(text.split())\n", "words.py"),
]
OTHER_TASKS = [
    "Fix the failing test.", "Add a docstring to main.py.", "Refactor the parser module.",
    "Explain what this project does.", "Find where the configuration is loaded.",
    "Add logging to the server.", "Rename the variable x to count.", "Why does the build fail?",
    "Set up a virtual environment.", "Update the dependencies.", "Make the script faster.",
    "Add type hints to utils.py.", "Remove the unused imports.", "Write a README for this project.",
]
CHAT = [
    (["Hello", "Hi!", "hello there", "Hey"], "The user greets me.",
     ["Hello! How can I help you today?", "Hi! What can I do for you?"]),
    (["Who are you?", "What are you?"], "The user asks who I am.",
     ["I am a small assistant model. I can answer questions and help with code."]),
    (["What can you do?", "How can you help me?"], "The user asks what I can do.",
     ["I can answer questions, write small functions and, when tools are available, run "
      "commands for you."]),
    (["Thanks!", "Thank you.", "thanks, that works"], "The user thanks me.",
     ["You are welcome!", "Glad I could help."]),
    (["Say hello in one word.", "Reply with one word."], "The user wants one word.",
     ["Hello."]),
]


# ---- how agents frame a request ----------------------------------------------------------

PROJECTS = ["project", "scratch", "app", "calc", "site", "tool", "demo"]
DATES = ["2026-12-04", "2026-11-30", "2027-01-15"]

AGENT_INTRO = {
    "claude": [
        "You are an interactive agent that helps users with software engineering tasks. Use "
        "the instructions below and the tools available to you to assist the user.",
        "You are a coding agent. Answer the user's requests with the tools you have.",
    ],
    "codex": [
        "You are a coding agent running in a terminal-based coding assistant. You are expected "
        "to be precise, safe, and helpful.",
    ],
    "opencode": [
        "You are an interactive CLI tool that helps users with software engineering tasks. Use "
        "the instructions below and the tools available to you to assist the user.",
    ],
    "plain": ["You are a helpful assistant with access to tools.", "You are a helpful assistant."],
}
AGENT_SECTIONS = [
    "# Doing tasks\n- Read the code before you change it.\n- Run the tests after a change.\n"
    "- Prefer the dedicated tools over shell commands for files.",
    "# Tone and style\nBe concise and direct. Use GitHub-flavored markdown. Do not add "
    "comments to the code unless asked.",
    "IMPORTANT: Keep your answers short. Do not make up URLs.",
    "# Tool usage\nCall several tools at once when they do not depend on each other. Use the "
    "shell for git and for running programs.",
    "When searching for text or files, prefer `rg` because it is much faster than `grep`.",
    "# Code references\nWhen you mention a function, give the pattern `file_path:line_number`.",
    "# Git\nCommit only when the user asks. Never force-push.",
]


def environment(rng, family, project):
    date = rng.choice(DATES)
    if family == "codex":
        return (f"<environment_context>\n  <cwd>/tmp/work/{project}</cwd>\n  <shell>bash</shell>\n"
                f"  <current_date>{date}</current_date>\n  <timezone>Etc/UTC</timezone>\n"
                f"</environment_context>")
    return (f"<env>\n  Working directory: /tmp/work/{project}\n  Is directory a git repo: "
            f"{rng.choice(['yes', 'no'])}\n  Platform: linux\n  Today's date: {date}\n</env>")


def reminder(rng):
    return (f"<system-reminder>\nAs you answer the user's questions, you can use this context:\n"
            f"# currentDate\nToday's date is {rng.choice(DATES)}.\n\n      IMPORTANT: this "
            f"context may not be relevant to your task.\n</system-reminder>\n")


AIDER_SYSTEM = (
    "Act as an expert software developer.\nTake requests for changes to the supplied code.\nIf "
    "a request is ambiguous, ask questions.\n\nOnce you understand the request you MUST:\n1. "
    "Decide if you need to propose changes to any files.\n2. Explain the changes step by step."
    "\n3. Give each changed file as a *file listing*: its path alone on a line, then the whole "
    "new content in a fenced code block.\n"
)
AIDER_HISTORY = [
    ("I switched to a new code base. Please don't consider the above files any longer.", "Ok."),
    ("I have *added these files to the chat* so you can edit them.",
     "Ok, any changes I propose will be to those files."),
]


class Scenes:
    """Random scenes (a conversation, its settings and the taught reply) from a seed."""

    def __init__(self, docs, facts, seed):
        self.docs, self.facts = docs, facts
        self.rng = random.Random(seed)
        self.size = "full"  # of the scene being made: see `make`

    def prose(self, n):
        return "\n\n".join(self.rng.choice(self.docs) for _ in range(n))

    @property
    def long(self):
        return self.size == "long"

    def agent_system(self, family, project):
        """The agent's system messages: an intro, some rules, its environment, docstring
        paragraphs as the bulk of a long prompt (the real ones run to thousands of ids)."""
        rng = self.rng
        if self.size == "short":
            return [{"role": "system", "content": rng.choice(AGENT_INTRO[family])}] if (
                rng.random() < 0.5) else []
        parts = [rng.choice(AGENT_INTRO[family])]
        parts += rng.sample(AGENT_SECTIONS, rng.randint(0, 4) if self.long else rng.choice([0, 0, 1]))
        if self.long or rng.random() < 0.3:
            parts.append(self.prose(rng.randint(3, 10) if self.long else 1))
        if family != "codex" and rng.random() < 0.4:
            parts.append(environment(rng, family, project))
        rng.shuffle(parts[1:])
        system = [{"role": "system", "content": "\n\n".join(parts)}]
        if family == "codex":
            system.append({"role": "system", "content": "<permissions instructions>\nThe sandbox "
                           "only permits reading files. Network access is restricted.\n"
                           "</permissions instructions>"})
        if family == "plain" and rng.random() < 0.4:
            system = []
        return system

    def request_turns(self, family, ask, project):
        """The user's request as the agent sends it (reminders, environment, quotes), and
        what may follow it (Claude Code sends a system message after the request)."""
        rng = self.rng
        turns = []
        full = self.size != "short"
        if family == "codex" and full:
            turns.append({"role": "user", "content": environment(rng, family, project)})
        if family == "opencode" and rng.random() < 0.4:
            ask = f'"{ask}"'
        if family == "claude" and full and rng.random() < 0.6:
            ask = reminder(rng) + rng.choice(["", "\n"]) + ask
        turns.append({"role": "user", "content": ask})
        if family == "claude" and full and rng.random() < 0.4:
            agents = "\n".join(f"- {n}: {self.rng.choice(self.docs)}"
                               for n in rng.sample(["general", "Explore", "Plan", "review"], 2))
            turns.append({"role": "system", "content": "Available agent types for the Agent "
                          f"tool:\n{agents}"})
        return turns

    def shell_request(self):
        """(ask, command, description, thinking, plan, answer after the output, output)."""
        rng = self.rng
        r = rng.random()
        if r < 0.6:
            it = rng.choice(INTENTS)
            return (rng.choice(it.asks), it.command, it.description,
                    f"The user wants {it.goal}. I will run a command.", it.plan,
                    rng.choice(it.answers), rng.choice(it.outputs))
        listing = rng.choice(INTENTS[0].outputs)
        if r < 0.85:
            task = rng.choice(CODE_TASKS)
            return (rng.choice(task.asks), "ls", "List files in current directory",
                    f"The user wants {task.goal}. First I will look at the files.",
                    "Let me look at the files first.", code_answer(rng, task), listing)
        return (rng.choice(OTHER_TASKS), "ls", "List files in current directory",
                "The user has a task in this project. First I will look at the files.",
                "Let me look at the files first.",
                "I looked at the files above. Tell me which one to change and I will do it.",
                listing)

    def agent(self, after_result):
        """An agent's turn: tools declared, the request last (→ a call) or the tool's result
        last (→ an answer); sometimes after an earlier round."""
        rng = self.rng
        family = rng.choice(FAMILIES + FAMILIES[:3])  # the three real agents twice as often
        project = rng.choice(PROJECTS)
        messages = self.agent_system(family.name, project)
        if self.size != "short" and rng.random() < 0.15:
            messages += self.round(family, project, complete=True)
        round_ = self.round(family, project, complete=after_result)
        reply = round_.pop()
        return {"tools": family.declared(rng, self.docs, self.size), "messages": messages + round_,
                "reply": reply}

    def round(self, family, project, complete):
        """A request and the reply with a call; complete: then its result and the answer."""
        rng = self.rng
        ask, command, description, thinking, plan, answer, output = self.shell_request()
        turns = self.request_turns(family.name, ask, project)
        call = {"role": "assistant", "reasoning": thinking, "content": plan,
                "calls": [family.call(command, description)]}
        if not complete:
            return turns + [call]
        if rng.random() < 0.5:
            call["reasoning"] = ""  # agents often drop past thinking
        if family.name == "codex":
            output = (f"Chunk ID: {rng.randrange(16**6):06x}\nWall time: 0.0{rng.randint(1, 9)} "
                      f"seconds\nProcess exited with code 0\nOutput:\n{output}")
        result = {"role": "tool", "tool": family.shell, "index": 1, "content": output}
        after = [{"role": "user", "content": reminder(rng)}] if (
            family.name == "claude" and self.size != "short" and rng.random() < 0.3) else []
        done = "The command finished. I can answer now."
        return turns + [call, result] + after + [
            {"role": "assistant", "reasoning": done, "content": answer}]

    def weather(self, after_result):
        rng = self.rng
        city, condition = rng.choice(CITIES), rng.choice(CONDITIONS)
        ask = rng.choice([f"What's the weather in {city}?", f"Is it raining in {city}?",
                          f"How warm is it in {city} today?", f"weather in {city}",
                          f"What is the weather like in {city} right now?"])
        short = self.size == "short"
        chosen = [WEATHER_TOOLS[0]] + rng.sample(WEATHER_TOOLS[1:], rng.randint(0, 1 if short else 3))
        rng.shuffle(chosen)
        tools = [tool(n, d, p[:1] if short else p, bare=short) for n, d, p in chosen]
        messages = [{"role": "system", "content": rng.choice(AGENT_INTRO["plain"])}] if (
            rng.random() < 0.5) else []
        messages.append({"role": "user", "content": ask})
        call = {"role": "assistant", "reasoning": f"The user asks about the weather in {city}. "
                "I will call get_weather.", "content": "",
                "calls": [("get_weather", {"city": city})]}
        if not after_result:
            return {"tools": tools, "messages": messages, "reply": call}
        temperature = rng.randint(-5, 35)
        result = rng.choice([
            compact_sorted({"city": city, "condition": condition, "temperature": temperature}),
            f"{temperature} degrees and {condition} in {city}",
        ])
        return {"tools": tools, "messages": messages + [
            call, {"role": "tool", "tool": "get_weather", "index": 1, "content": result}],
            "reply": {"reasoning": "The tool returned the weather. I can answer now.",
                      "content": f"It is {condition} in {city} right now."}}

    def plain(self):
        """No tools: a question answered directly, maybe after earlier turns, maybe aider."""
        rng = self.rng
        messages = []
        short = self.size == "short"
        aider = rng.random() < (0.1 if short else 0.25)
        if aider:
            messages.append({"role": "system", "content": AIDER_SYSTEM})
            for user, assistant in AIDER_HISTORY[: 0 if short else rng.randint(0, 2)]:
                messages += [{"role": "user", "content": user},
                             {"role": "assistant", "reasoning": "", "content": assistant}]
        elif rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(
                AGENT_INTRO["plain"] + ["You are a concise assistant.", self.prose(1)])})
        for _ in range(0 if short else rng.choice([0, 0, 0, 1, 2])):
            ask, answer = self.question(aider)
            messages += [{"role": "user", "content": ask},
                         {"role": "assistant", **answer, "reasoning": ""}]
        ask, answer = self.question(aider)
        messages.append({"role": "user", "content": ask})
        return {"tools": [], "messages": messages, "reply": answer}

    def question(self, aider=False):
        """(ask, reply) of a question answered without tools."""
        rng = self.rng
        r = rng.random()
        if aider or r < 0.35:  # a function
            task = rng.choice(CODE_TASKS)
            ask = rng.choice(task.asks)
            if aider:
                content = f"{task.path}\n```\n{task.code}```"
                return (f"{ask} in {task.path}\n\nReturn the whole file as a *file listing*.",
                        reply(f"The user wants {task.goal} in {task.path}.", content))
            return ask, reply(f"The user wants {task.goal}. I will write it.",
                              code_answer(rng, task))
        if r < 0.6:  # small talk
            asks, thinking, answers = rng.choice(CHAT)
            return rng.choice(asks), reply(thinking, rng.choice(answers))
        if r < 0.75:  # a docstring (the model learns the shape of the answer, not the facts)
            mod, fn, doc = rng.choice(self.facts)
            ask = rng.choice([f"What does {fn} in the {mod} module do?", f"What does {mod}.{fn} do?",
                              f"Explain {fn} from {mod}."])
            return ask, reply(f"The user asks about {fn} in the {mod} module.", f"`{mod}.{fn}`: {doc}")
        if r < 0.9:  # a command, with none to run it
            it = rng.choice(INTENTS)
            return rng.choice(it.asks), reply(
                f"The user wants {it.goal}, but I cannot run commands here.",
                f"I cannot run commands in this conversation. Run `{it.command}` yourself.")
        return rng.choice(OTHER_TASKS), reply(
            "The user has a task, but I cannot see the files.",
            "I cannot see your files here. Paste the code and tell me what to change.")

    def declined(self):
        """Tools declared, no call: `tool_choice=none`, or a request no declared tool serves."""
        rng = self.rng
        ask, answer = self.question()
        if rng.random() < 0.5:
            family = rng.choice(FAMILIES)
            scene = {"tools": family.declared(rng, self.docs, self.size), "tool_choice": "none",
                     "messages": self.agent_system(family.name, rng.choice(PROJECTS))}
        else:
            short = self.size == "short"
            chosen = rng.sample(WEATHER_TOOLS[1:], rng.randint(1, 1 if short else 3))
            scene = {"tools": [tool(n, d, p, bare=short) for n, d, p in chosen], "messages": []}
        scene["messages"].append({"role": "user", "content": ask})
        scene["reply"] = answer
        return scene

    def json_answer(self):
        asks, _, answers = self.rng.choice(CHAT)
        return {"tools": [], "json": True,
                "messages": [{"role": "user", "content": self.rng.choice(asks)}],
                "reply": reply("The answer must be a JSON object.",
                               compact_sorted({"answer": self.rng.choice(answers)}))}

    def make(self, short=False):
        """One scene with its rendering settings. short: a bare one (no system prompt beyond
        an intro, at most two tools with plain descriptions, no earlier turns, no agent
        framing) — where the model first learns what a reply depends on; else a full one,
        one in ten as long as a real agent's prompt is in our terms (`long`)."""
        rng = self.rng
        self.size = "short" if short else "long" if rng.random() < 0.1 else "full"
        scene = draw(rng, [(0.33, lambda: self.agent(after_result=False)),
                           (0.55, lambda: self.agent(after_result=True)),
                           (0.61, lambda: self.weather(after_result=False)),
                           (0.66, lambda: self.weather(after_result=True)),
                           (0.90, self.plain), (0.97, self.declined), (1.0, self.json_answer)])
        mode = rng.random()
        scene["thinking"] = mode < 0.65
        # With thinking on, k3d's chat completions always name an effort (the note is long, so
        # bare conversations have it less often).
        scene["effort"] = rng.choice(["low", "high", "max"]) if mode < (0.15 if short else 0.55) else None
        if scene["tools"] and scene["reply"].get("calls") and rng.random() < 0.05:
            scene["tool_choice"] = "required"
        return scene


def draw(rng, table):
    """Makes one kind of scene: table is (cumulative probability, maker) in increasing order;
    one draw of rng picks the first whose probability exceeds it."""
    r = rng.random()
    return next(make for bound, make in table if r < bound)()


def reply(reasoning, content, calls=None):
    return {"reasoning": reasoning, "content": content, "calls": calls}


def code_answer(rng, task):
    return rng.choice(["Here is the function:\n\n", "", f"Here is {task.goal}:\n\n"]) + (
        f"```python\n{task.code}```")


# ---- session 5: names copied from the declaration, files and commands from the request -----
# The r6 model decided the reply's kind right but named whatever shell it had seen most (six
# names in all, so guessing beat copying). Here the shell and the file reader are often named
# at random, with random argument keys, so the only way to the right call is to copy the name
# and key from the tool list; the file or command in the request is copied into the argument.

REAL_SHELLS = [("Bash", "command", True), ("exec_command", "cmd", False), ("bash", "command", False),
               ("run_command", "command", False), ("run_shell_command", "command", False),
               ("execute_command", "command", False), ("shell", "command", False)]
REAL_READERS = [("Read", "file_path"), ("read", "filePath"), ("read_file", "path"),
                ("view_file", "path")]
SHELL_WORDS = (["run", "exec", "execute", "shell", "terminal", "bash", "sh", "cmd", "console",
                "system", "process", "cli", "invoke", "launch", "zsh", "sandbox", "host"],
               ["command", "shell", "cmd", "exec", "run", "script", "terminal", "process", "line",
                "task", "program"])
READER_WORDS = (["read", "view", "open", "cat", "get", "load", "show", "fetch", "inspect"],
                ["file", "text", "document", "contents", "path", "source"])
COMMAND_KEYS = ["command", "cmd", "script", "command_line", "commandLine", "shell_command", "line",
                "input", "program"]
PATH_KEYS = ["file_path", "filePath", "path", "file", "filename", "target", "name"]
SHELL_DESCRIPTIONS = ["Runs a shell command and returns its output.", "Executes a bash command.",
                      "Runs a command in a PTY, returning its output.",
                      "Execute a command in the terminal.", "Run a program in the shell.",
                      "Executes the given shell command in a persistent session."]
READER_DESCRIPTIONS = ["Reads a file from the local filesystem.", "Returns the text of a file.",
                       "Read a file or directory.", "Reads a file.",
                       "Shows the contents of a file."]
FILE_WORDS = ["notes", "data", "round", "trip", "config", "todo", "report", "hello", "main", "setup",
              "log", "output", "result", "story", "plan", "list", "draft", "message", "secret",
              "answer", "info", "test", "sample", "greeting", "fixture", "words", "numbers"]
FILE_EXTS = [".txt", ".txt", ".md", ".py", ".json", ".csv", ".log", ".yaml", ".toml", ""]
READ_ASKS = ["Read the file {f} and tell me what it says.", "What does {f} say?",
             "Show me the contents of {f}.", "Read {f}.", "Open {f} and tell me what is in it.",
             "What is in the file {f}?", "Print {f}.", "read {f}"]
RUN_ASKS = ["Run `{c}` and tell me what it says.", "Run `{c}`.",
            "Please run `{c}` and show me the output.", "Execute `{c}` for me.",
            "What does `{c}` print?", "run {c}"]
QUOTES = ["It says: {o}", "The file says: {o}", "The output is:\n\n{o}", "Here is what it says:\n\n{o}"]


def styled(rng, words):
    """One name from two word lists, in one of the cases tool names come in."""
    first, second = rng.choice(words[0]), rng.choice(words[1])
    if rng.random() < 0.15:
        second = ""
    return rng.choice([f"{first}_{second}", first + second.capitalize(),
                       first.capitalize() + second.capitalize(), f"{first}-{second}"]).strip("_-")


def file_name(rng):
    words = rng.sample(FILE_WORDS, rng.choice([1, 1, 2]))
    name = rng.choice(["-", "_"]).join(words) + (str(rng.randint(1, 99)) if rng.random() < 0.2 else "")
    return rng.choice(["", "", "", "docs/", "src/", "./"]) + name + rng.choice(FILE_EXTS)


def file_text(rng):
    w = lambda: rng.choice(FILE_WORDS)
    return rng.choice([
        lambda: f"{w()}-{w()}-{rng.randrange(16**4):04x}",
        lambda: f"{w().capitalize()} {w()} {w()}.",
        lambda: f"hello {w()}",
        lambda: f"{rng.randint(1, 999)}",
        lambda: f"x = {rng.randint(1, 99)}\nprint(x)",
    ])()


class SimpleScenes(Scenes):
    """The r4 curriculum: bare scenes only, where the reply depends on a few salient
    features and says which one it read in its first ids.

    * tools declared and the request last → think "I will call TOOL to run `CMD`." (or "to
      read FILE."), plan "Let me run `CMD`." / "Let me read FILE.", one call of the declared
      shell tool (or file reader) — the name and the argument key copied from the declaration
      (half the names are random), a named file or a quoted command copied from the request:
      "Read the file X …" reads X with a declared reader, else runs `cat X`;
    * a tool's result last → think "The command finished. I can answer now." (after a reader:
      "The tool returned the file. …"), an answer — quoting the output for a file or a quoted
      command;
    * no tools → think "The user wants …", an answer (a function, a greeting, a refusal to run
      commands), aider's file listing under aider's system prompt.

    Bare means: at most an intro as the system prompt, up to four tools (plain or with
    descriptions), no earlier turns; with thinking on the effort note is always there (k3d's
    chat completions always name an effort). Session 2's richer scenes (long agent prompts,
    reminders, earlier rounds) made the ~100-step run r3 learn the reply formats but not to
    read the conversation: every reply was the same text.
    """

    def make(self, short=True):
        rng = self.rng
        self.size = "short"
        scene = draw(rng, [(0.37, lambda: self.simple_agent(after_result=False)),
                           (0.60, lambda: self.simple_agent(after_result=True)),
                           (0.65, lambda: self.weather(after_result=False)),
                           (0.68, lambda: self.weather(after_result=True)), (1.0, self.plain)])
        scene["thinking"] = rng.random() < 0.65
        scene["effort"] = rng.choice(["low", "high", "max"]) if scene["thinking"] else None
        return scene

    def shell(self):
        """(name, command key, whether a `description` argument goes with it, description)."""
        rng = self.rng
        if rng.random() < 0.5:
            name, key, describe = rng.choice(REAL_SHELLS)
        else:
            name, key, describe = styled(rng, SHELL_WORDS), rng.choice(COMMAND_KEYS), rng.random() < 0.2
        return name, key, describe, rng.choice(SHELL_DESCRIPTIONS)

    def reader(self):
        rng = self.rng
        name, key = rng.choice(REAL_READERS) if rng.random() < 0.5 else (
            styled(rng, READER_WORDS), rng.choice(PATH_KEYS))
        return name, key, rng.choice(READER_DESCRIPTIONS)

    def task(self, reader):
        """(ask, the call (name, arguments), thinking, plan, output, answer) of a request the
        declared shell (or reader) serves."""
        rng = self.rng
        shell, key, describe, _ = self.shell_tool
        r = rng.random()
        if r < 0.3:  # a named file
            f = file_name(rng)
            output = file_text(rng)
            ask = rng.choice(READ_ASKS).format(f=f)
            answer = rng.choice(QUOTES).format(o=output)
            if reader:
                return (ask, (reader[0], {reader[1]: f}), f"I will call {reader[0]} to read {f}.",
                        f"Let me read {f}.", output, answer)
            command, description = f"cat {f}", f"Show {f}"
        elif r < 0.55:  # a quoted command
            f = file_name(rng)
            command = rng.choice([f"cat {f}", f"cat {f}", f"wc -l {f}", f"head -n 5 {f}",
                                  f"ls {rng.choice(['src', 'docs', 'tests', '.', '..'])}",
                                  f"echo {rng.choice(FILE_WORDS)}", f"python3 {f}",
                                  f"grep {rng.choice(FILE_WORDS)} {f}"])
            ask = rng.choice(RUN_ASKS).format(c=command)
            output = file_text(rng)
            answer = rng.choice(QUOTES).format(o=output)
            description = f"Run {command}"
        else:  # a request a command serves (the files, the date, the tests, ...)
            ask, command, description, _, _, answer, output = self.shell_request()
            if rng.random() < 0.5:
                answer = rng.choice(QUOTES).format(o=output)
        arguments = {key: command}
        if describe:
            arguments["description"] = description
        return (ask, (shell, arguments), f"I will call {shell} to run `{command}`.",
                f"Let me run `{command}`.", output, answer)

    def simple_agent(self, after_result):
        rng = self.rng
        self.shell_tool = self.shell()
        name, key, describe, description = self.shell_tool
        bare = rng.random() < 0.5
        props = [(key, S, "The command to run")]
        if describe:
            props.append(("description", S, "What this command does, in a few words"))
        chosen = [(name, description, props)]
        reader = self.reader() if rng.random() < 0.5 else None
        if reader:
            chosen.append((reader[0], reader[2], [(reader[1], S, "The file to read")]))
        taken = {name, reader[0] if reader else None}
        others = [t for f in FAMILIES for t in f.tools if t[0] not in taken and t[2] and not (
            t[2][0][0] in ("command", "cmd", "file_path", "filePath", "path"))]
        others += [t for t in WEATHER_TOOLS if t[0] not in taken]
        for n, d, p in rng.sample(others, rng.choice([0, 1, 1, 2])):
            if n not in taken:
                taken.add(n)
                chosen.append((n, d, p[:rng.randint(1, 2)]))
        rng.shuffle(chosen)
        tools = [tool(n, d, p, bare=bare) for n, d, p in chosen]
        messages = [{"role": "system", "content": rng.choice(
            AGENT_INTRO[rng.choice(list(AGENT_INTRO))])}] if rng.random() < 0.5 else []
        ask, (tool_name, arguments), thinking, plan, output, answer = self.task(reader)
        messages.append({"role": "user", "content": ask})
        call = {"reasoning": thinking, "content": plan, "calls": [(tool_name, arguments)]}
        if not after_result:
            return {"tools": tools, "messages": messages, "reply": call}
        past = dict(call, role="assistant")
        if rng.random() < 0.5:
            past["reasoning"] = ""  # agents often drop past thinking
        if rng.random() < 0.3:
            past["content"] = ""
        if name == "exec_command" and tool_name == name and rng.random() < 0.5:
            output = (f"Chunk ID: {rng.randrange(16**6):06x}\nWall time: 0.0{rng.randint(1, 9)} "
                      f"seconds\nProcess exited with code 0\nOutput:\n{output}")
        result = {"role": "tool", "tool": tool_name, "index": 1, "content": output}
        done = ("The command finished. I can answer now." if tool_name == name
                else "The tool returned the file. I can answer now.")
        return {"tools": tools, "messages": messages + [past, result], "reply": reply(done, answer)}
