# mypy: ignore-errors
# Technique: catch an error the runtime's own guard raised (its code is believed), put an
# object of the plugin's in its `details`, re-raise: the worker serialised the very object,
# so `to_wire` ran the plugin's `str.__getitem__` inside the error serialisation and sent
# what it returned (a non-str there, or an int beyond 64 bits, crashed the worker's encoder).
# Found in the second red-team pass of the in-interpreter layer; was a real in-interpreter
# escape (plugin code inside the worker's error serialisation) before the fix.
from suaveplan import SuaveplanError


class Text(str):
    def __getitem__(self, index):
        return "SANDBOX-" + "ESCAPED"


def attack(secret_path, canary_path):
    try:
        getattr(attack, "_" * 2 + "globals" + "_" * 2)
    except SuaveplanError as err:
        err.details = {"name": Text("harmless")}
        raise
