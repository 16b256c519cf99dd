"""The kinds of document in the sample corpus, and the names, dates and figures they mention.

Data more than logic: each kind has title patterns, its section headings in the order such a
document has them, and fact sentences whose fields (`{org}`, `{date}`, `{amount}` ...) are filled
per document and per sentence. A document keeps one cast (its parties, people, systems) throughout,
as a real one does, while its dates and figures change from sentence to sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DocKind:
    """One kind of document: its title patterns, its headings in order and its fact sentences."""

    name: str
    titles: tuple[str, ...]
    headings: tuple[str, ...]
    facts: tuple[str, ...]


# fmt: off
# A data table: one kind per block reads better than one string per line.
KINDS: tuple[DocKind, ...] = (
    DocKind("contract",
            ("Master Services Agreement between {org} and {org2}",
             "Lease Agreement for premises in {place}"),
            ("Definitions", "Term and Renewal", "Fees and Payment", "Obligations of the Provider",
             "Obligations of the Customer", "Service Levels", "Confidentiality",
             "Liability and Indemnity", "Termination", "Dispute Resolution", "Notices",
             "Governing Law"),
            ("This agreement between {org} and {org2} takes effect on {date} and runs for {n} "
             "months.",
             "The customer pays {amount} per month, adjusted each year on {date}.",
             "Either party may end the agreement with {n} days of written notice to {person}.")),
    DocKind("incident report",
            ("Incident Report {ref}: {system} outage",
             "Post-incident review of the {system}, {date}"),
            ("Summary", "Impact", "Timeline", "Detection", "Root Cause", "Contributing Factors",
             "Response", "Recovery", "Lessons Learned", "Action Items", "Follow-up Review"),
            ("At {time} on {date} the {system} began failing {n} percent of requests.",
             "The on-call engineer, {person}, was paged {n} minutes after the first alert.",
             "Service was fully restored at {time}, after {n} minutes of degraded operation.")),
    DocKind("filing",
            ("Quarterly Report of {org} for the period ending {date}",
             "Annual Report of {org}, {year}"),
            ("Business Overview", "Results of Operations", "Liquidity and Capital Resources",
             "Risk Factors", "Legal Proceedings", "Market Risk", "Segment Information",
             "Controls and Procedures", "Outlook", "Subsequent Events"),
            ("Revenue for the period was {amount}, against {amount2} a year earlier.",
             "{org} employed {n} people in {place} at the end of the period.",
             "On {date} the board approved a dividend of {amount} per share.")),
    DocKind("court filing",
            ("Motion to Compel in {org} v. {org2}, Case No. {ref}",
             "Brief of {org} in Case No. {ref}"),
            ("Introduction", "Statement of Facts", "Procedural History", "Legal Standard",
             "Argument", "Relief Requested", "Conclusion", "Certificate of Service"),
            ("The complaint was filed on {date} in the district court in {place}.",
             "Counsel for {org}, {person}, conferred with opposing counsel on {date}.",
             "{org2} has produced {n} of the documents requested in the first set.")),
    DocKind("research paper",
            ("{topic} for {topic2}: an empirical study", "On {topic} under {topic2}"),
            ("Abstract", "Introduction", "Related Work", "Method", "Experimental Setup", "Results",
             "Ablations", "Discussion", "Limitations", "Conclusion", "Appendix"),
            ("We evaluate on {n} documents collected between {date} and {date2}.",
             "The proposed method lowers p99 latency by {n} percent at equal throughput.",
             "{person} and colleagues first described the baseline in {year}.")),
    DocKind("maintenance log",
            ("Maintenance Log, {place} site, {year}", "Plant maintenance record {ref}, {place}"),
            ("Inspection", "Scheduled Work", "Unscheduled Repairs", "Parts and Materials",
             "Safety Checks", "Open Items", "Handover Notes"),
            ("On {date} {person} replaced the {part} on unit {n}.",
             "Inspection on {date} found {n} items that need attention before {date2}.",
             "The {part} on unit {n} was ordered from {org} at a cost of {amount}.")),
)

ORGS = ("Northwind Logistics", "Harbor Freight Lines", "Aldercrest Health", "Bluewater Energy",
        "Kestrel Analytics", "Granite Mutual", "Redfern Foods", "Lumen Telecom",
        "Stonebridge Capital", "Orchard Retail Group", "Meridian Rail", "Cobalt Software")
PEOPLE = ("Ana Ruiz", "Tom Becker", "Priya Nair", "Jonas Lind", "Mei Chen", "Samuel Okafor",
          "Laura Moretti", "Daniel Park", "Fatima Haddad", "Erik Dahl")
SYSTEMS = ("payments gateway", "order database", "login service", "search cluster",
           "message queue", "billing pipeline", "storage array", "DNS resolver")
PLACES = ("Rotterdam", "Denver", "Lyon", "Osaka", "Leeds", "Porto", "Tacoma", "Gdansk")
TOPICS = ("chunked prefill", "admission control", "KV cache reuse", "latency prediction",
          "batch scheduling", "prefix caching")
PARTS = ("main bearing", "hydraulic pump", "drive belt", "air filter", "control valve",
         "cooling fan")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
# fmt: on


def section_heading(kind: DocKind, s: int) -> str:
    """Heading of section `s` (0-based); a long document runs through its headings in parts."""
    base = kind.headings[s % len(kind.headings)]
    part = s // len(kind.headings)
    return f"{s + 1}. {base}" + (f" (part {part + 1})" if part else "")


def draw_cast(rng: np.random.Generator) -> dict:
    """The parties, people and things one document keeps talking about."""
    org, org2 = (ORGS[int(k)] for k in rng.choice(len(ORGS), size=2, replace=False))
    topic, topic2 = (TOPICS[int(k)] for k in rng.choice(len(TOPICS), size=2, replace=False))
    return {
        "org": org,
        "org2": org2,
        "person": pick(rng, PEOPLE),
        "system": pick(rng, SYSTEMS),
        "place": pick(rng, PLACES),
        "part": pick(rng, PARTS),
        "topic": topic[0].upper() + topic[1:],
        "topic2": topic2,
        "ref": f"NS-{int(rng.integers(1000, 10000))}",
    }


def draw_figures(rng: np.random.Generator) -> dict:
    """Fresh dates, times, amounts and counts for one sentence."""
    return {
        "date": draw_date(rng),
        "date2": draw_date(rng),
        "year": int(rng.integers(2019, 2026)),
        "time": f"{int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d}",
        "amount": draw_amount(rng),
        "amount2": draw_amount(rng),
        "n": int(rng.integers(2, 100)),
    }


def draw_date(rng: np.random.Generator) -> str:
    return f"{int(rng.integers(1, 29))} {pick(rng, MONTHS)} {int(rng.integers(2019, 2026))}"


def draw_amount(rng: np.random.Generator) -> str:
    return f"${int(rng.integers(1_000, 5_000_000)):,}"


def pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]
