"""Questions generated from a World's facts: one-hop (one passage holds the answer) and two-hop (a bridge entity)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from envs.search_qa.world import World


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    kind: str
    gold_titles: tuple[str, ...]  # the passages to read, in order; the first is named in the question
    aliases: tuple[str, ...] = ()  # other answers graded as correct, e.g. "Tesk" for "Tesk River"

    @property
    def hops(self) -> int:
        return len(self.gold_titles)

    def accepted(self) -> tuple[str, ...]:
        return (self.answer, *self.aliases)


def _short(name: str, suffix: str) -> tuple[str, ...]:
    return (name.removesuffix(suffix),) if name.endswith(suffix) else ()


def _one_hop(world: World) -> Iterator[Question]:
    for name, person in world.people.items():
        yield Question(f"In which year was {name} born?", str(person.birth_year), "birth_year", (name,))
        yield Question(f"In which town was {name} born?", person.home_town, "home_town", (name,))
    for name, town in world.towns.items():
        yield Question(f"What is the population of {name}?", str(town.population), "town_population", (name,))
        yield Question(f"In which year was {name} founded?", str(town.founded), "town_founded", (name,))
        river = town.river
        yield Question(f"Which river flows through {name}?", river, "town_river", (name,), _short(river, " River"))
    for name, river in world.rivers.items():
        yield Question(f"How many kilometres long is the {name}?", str(river.length_km), "river_length", (name,))
        mouth = river.mouth
        yield Question(f"Into which sea does the {name} flow?", mouth, "river_mouth", (name,), _short(mouth, " Sea"))
    for name, company in world.companies.items():
        yield Question(f"Who founded {name}?", company.founder, "company_founder", (name,))
        yield Question(f"In which year was {name} founded?", str(company.founded), "company_founded", (name,))
        yield Question(
            f"In which town does {name} have its headquarters?", company.headquarters, "company_headquarters", (name,)
        )
    for name, invention in world.inventions.items():
        yield Question(f"Who invented the {name}?", invention.inventor, "inventor", (name,))
        yield Question(f"In which year was the {name} invented?", str(invention.year), "invention_year", (name,))


def _two_hop(world: World) -> Iterator[Question]:
    for name, company in world.companies.items():
        founder = world.people[company.founder]
        gold = (name, founder.name)
        yield Question(
            f"In which year was the founder of {name} born?", str(founder.birth_year), "founder_birth_year", gold
        )
        yield Question(f"In which town was the founder of {name} born?", founder.home_town, "founder_home_town", gold)
        town = world.towns[company.headquarters]
        yield Question(
            f"Which river flows through the town where {name} has its headquarters?",
            town.river,
            "headquarters_river",
            (name, town.name),
            _short(town.river, " River"),
        )
    for name, invention in world.inventions.items():
        inventor = world.people[invention.inventor]
        gold = (name, inventor.name)
        yield Question(
            f"In which year was the inventor of the {name} born?", str(inventor.birth_year), "inventor_birth_year", gold
        )
        yield Question(
            f"In which town was the inventor of the {name} born?", inventor.home_town, "inventor_home_town", gold
        )
    for name, town in world.towns.items():
        river = world.rivers[town.river]
        yield Question(
            f"How many kilometres long is the river that flows through {name}?",
            str(river.length_km),
            "town_river_length",
            (name, river.name),
        )
    for name, person in world.people.items():
        town = world.towns[person.home_town]
        yield Question(
            f"Which river flows through the home town of {name}?",
            town.river,
            "home_town_river",
            (name, town.name),
            _short(town.river, " River"),
        )


ONE_HOP_KINDS = (
    "birth_year",
    "home_town",
    "town_population",
    "town_founded",
    "town_river",
    "river_length",
    "river_mouth",
    "company_founder",
    "company_founded",
    "company_headquarters",
    "inventor",
    "invention_year",
)
TWO_HOP_KINDS = (
    "founder_birth_year",
    "founder_home_town",
    "headquarters_river",
    "inventor_birth_year",
    "inventor_home_town",
    "town_river_length",
    "home_town_river",
)
KINDS = {"one_hop": ONE_HOP_KINDS, "two_hop": TWO_HOP_KINDS}


def expand_kinds(names: list[str] | tuple[str, ...]) -> frozenset[str]:
    """Question kinds from names that are kinds or the groups "one_hop" / "two_hop"; unknown names raise."""
    if isinstance(names, str):
        raise ValueError(f"question_types must be a list of names, for example [{names!r}], not the string {names!r}")
    known = set(ONE_HOP_KINDS) | set(TWO_HOP_KINDS)
    kinds: set[str] = set()
    for name in names:
        if name in KINDS:
            kinds.update(KINDS[name])
        elif name in known:
            kinds.add(name)
        else:
            raise ValueError(
                f"unknown question type {name!r}; use 'one_hop', 'two_hop' or kinds from: {', '.join(sorted(known))}"
            )
    if not kinds:
        raise ValueError("question_types is empty; name at least one, for example ['one_hop', 'two_hop']")
    return frozenset(kinds)


def make_questions(world: World) -> list[Question]:
    """Every question the world supports, in a fixed order (one-hop first)."""
    return [*_one_hop(world), *_two_hop(world)]
