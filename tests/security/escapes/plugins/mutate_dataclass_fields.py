# mypy: ignore-errors
# Technique: mutate module-level shared state in an allowlisted module (`random.seed`,
# `decimal.getcontext`).
import decimal
import random


def attack(secret_path, canary_path):
    random.seed(0)
    decimal.getcontext().prec = 1
    return [random.random() < 1, str(decimal.Decimal(1) / 3)]
