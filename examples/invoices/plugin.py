"""Example plugin: summarise uploaded invoice CSVs into a report, and reconcile them with the
payments a payment API reports (runs inside the VM sandbox)."""

import csv
import io

from suaveplan import db, events, fetch, fs, log, secrets


def _totals(month):
    text = fs.read_text("/uploads/" + month + ".csv")
    totals = {}
    for row in csv.DictReader(io.StringIO(text)):
        totals[row["customer"]] = totals.get(row["customer"], 0.0) + float(row["total"])
    return totals


def summarize(month):
    totals = _totals(month)
    lines = [f"{name}: {amount:.2f}" for name, amount in sorted(totals.items())]
    fs.write_text("/reports/" + month + ".txt", "\n".join(lines) + "\n")
    db.query("INSERT INTO billing_reports (month, customers) VALUES (?, ?)", [month, len(totals)])
    events.publish("invoice.summarised", {"month": month, "customers": len(totals)})
    log.info("summarised " + month)
    return totals


def reconcile(month, api="https://api.stripe.com"):
    """What each customer still owes for `month`: invoiced totals minus reported charges."""
    totals = _totals(month)
    key = secrets.get("STRIPE_SECRET_KEY")
    reply = fetch(api + "/v1/charges?month=" + month, headers={"Authorization": "Bearer " + key})
    if reply.status != 200:
        raise ValueError("the payment API answered " + str(reply.status))
    paid = {}
    for charge in reply.json()["data"]:
        paid[charge["customer"]] = paid.get(charge["customer"], 0.0) + charge["amount"] / 100
    reported = db.query("SELECT customers FROM billing_reports WHERE month = ?", [month])
    owed = {}
    for name, total in sorted(totals.items()):
        if abs(total - paid.get(name, 0.0)) > 0.005:
            owed[name] = round(total - paid.get(name, 0.0), 2)
    return {"owed": owed, "reports": len(reported)}


def try_to_escape():
    """Reach for something the manifest does not grant: refused with SAND_PERM_DENIED."""
    return fs.read_text("/config/secrets.env")
