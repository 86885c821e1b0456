"""The seed incident as status-page input (six instances incl. a hostile log line) and a small DOM reader
for asserting on rendered HTML without a browser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from html.parser import HTMLParser

from tests.scenarios import (
    DAEMON_REFUSED_TAIL,
    LATER,
    completed_report,
    error_report,
    ev,
    make_report,
)

HOSTILE_LINE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
NOW = LATER + timedelta(hours=1)

FIRST = error_report("pro-4000-0-3f9a1c", "40213", DAEMON_REFUSED_TAIL, host_id="7781")
SECOND = error_report("pro-4000-1-8be210", "51877", DAEMON_REFUSED_TAIL, host_id="9001", registered_min=5)
SLOW = completed_report("pro-4000-0-c41d07", "62001", 20.0, host_id="7781", registered_min=40)
RUNNING = make_report("pro-4000-0-9d0e11", "80808", registered_min=200,
                      events=[ev("params", "done", 215), ev("benchmark", "started", 220)])
FAST = completed_report("rtx4090-0-aa11f0", "90001", 52.0, pool="rtx4090", gpu_name="RTX 4090", host_id="1200",
                        destroyed_min=90)
HOSTILE = error_report("rtx4090-1-e71c00", "90002", ("cuzk-bench: starting", HOSTILE_LINE), pool="rtx4090",
                       gpu_name="RTX 4090", host_id="1201", registered_min=3)


class DomCollector(HTMLParser):
    """Every element with its attributes and the text directly or indirectly inside it (enough to assert on)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self.open: list[Element] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if tag not in ("meta", "br", "img", "input", "link"):
            self.open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.open) - 1, -1, -1):
            if self.open[index].tag == tag:
                del self.open[index:]
                break

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        for element in self.open:
            element.text.append(data)

    def find(self, tag: str | None = None, **attrs: str) -> list[Element]:
        return [e for e in self.elements if (tag is None or e.tag == tag)
                and all(e.attrs.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]

    def with_class(self, css: str, tag: str | None = None) -> list[Element]:
        return [e for e in self.elements if (tag is None or e.tag == tag) and css in e.attrs.get("class", "").split()]


def parse(page: str) -> DomCollector:
    dom = DomCollector()
    dom.feed(page)
    dom.close()
    return dom


def text_of(element: Element) -> str:
    return re.sub(r"\s+", " ", "".join(element.text)).strip()


def table_rows(dom: DomCollector, section_id: str) -> list[list[str]]:
    """The body rows of the table in a section, as cell texts."""
    section = dom.find("section", id=section_id)[0]
    inside = dom.elements[dom.elements.index(section) + 1:]
    end = next((i for i, e in enumerate(inside) if e.tag == "section"), len(inside))
    rows: list[list[str]] = []
    for element in inside[:end]:
        if element.tag == "tr":
            rows.append([])
        elif element.tag == "td":
            rows[-1].append(text_of(element))
    return [r for r in rows if r]


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: list[str] = field(default_factory=list)
