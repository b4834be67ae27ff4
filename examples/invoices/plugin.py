"""Example plugin: summarise uploaded invoice CSVs into a report (runs inside the VM sandbox)."""

import csv
import io

from suaveplan import db, events, fs, log


def summarize(month):
    text = fs.read_text("/uploads/" + month + ".csv")
    totals = {}
    for row in csv.DictReader(io.StringIO(text)):
        totals[row["customer"]] = totals.get(row["customer"], 0.0) + float(row["total"])
    lines = [f"{name}: {amount:.2f}" for name, amount in sorted(totals.items())]
    fs.write_text("/reports/" + month + ".txt", "\n".join(lines) + "\n")
    db.query("INSERT INTO billing_reports (month, customers) VALUES (?, ?)", [month, len(totals)])
    events.publish("invoice.summarised", {"month": month, "customers": len(totals)})
    log.info("summarised " + month)
    return totals


def try_to_escape():
    """Reach for something the manifest does not grant: refused with SAND_PERM_DENIED."""
    return fs.read_text("/config/secrets.env")
