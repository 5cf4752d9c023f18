"""Encyclopedia-style passages, one per entity of a World, with a little varied wording per passage."""

from __future__ import annotations

import random
from dataclasses import dataclass

from envs.search_qa.world import DEVICE_USES, World


@dataclass(frozen=True)
class Document:
    title: str
    text: str

    def indexed_text(self) -> str:
        return f"{self.title}. {self.text}"


def render_corpus(world: World, seed: int) -> list[Document]:
    """Passages for every entity, titled by its name; wording choices come from `seed`."""
    rng = random.Random(seed)
    hq_of: dict[str, list[str]] = {}
    for company in world.companies.values():
        hq_of.setdefault(company.headquarters, []).append(company.name)

    documents = [_person(world, person_name, rng) for person_name in world.people]
    documents += [_town(world, name, hq_of.get(name, []), rng) for name in world.towns]
    documents += [_river(world, name) for name in world.rivers]
    documents += [_company(world, name, rng) for name in world.companies]
    documents += [_invention(world, name) for name in world.inventions]
    return documents


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _person(world: World, name: str, rng: random.Random) -> Document:
    person = world.people[name]
    surname = name.split()[-1]
    opening = rng.choice(
        [
            f"{name} was {_a(person.profession)} born in {person.home_town} in {person.birth_year}.",
            f"{name} (born {person.birth_year} in {person.home_town}) was {_a(person.profession)}.",
        ]
    )
    sentences = [opening]
    sentences += [f"{surname} founded {company} in {world.companies[company].founded}." for company in person.companies]
    sentences += [
        f"{surname} is remembered for inventing the {invention} in {world.inventions[invention].year}."
        for invention in person.inventions
    ]
    if not person.companies and not person.inventions:
        sentences.append(f"{surname} spent most of a long career in the province of {_province(world, person)}.")
    return Document(name, " ".join(sentences))


def _province(world: World, person) -> str:
    return world.towns[person.home_town].province


def _town(world: World, name: str, companies: list[str], rng: random.Random) -> Document:
    town = world.towns[name]
    size = "city" if town.population >= 100_000 else "town"
    sentences = [
        f"{name} is a {size} in the province of {town.province}, on the banks of the {town.river}.",
        rng.choice(
            [
                f"It was founded in {town.founded} and has a population of {town.population}.",
                f"Founded in {town.founded}, it is home to {town.population} people.",
            ]
        ),
    ]
    if companies:
        sentences.append(f"{_listing(companies)} {'has' if len(companies) == 1 else 'have'} headquarters in {name}.")
    return Document(name, " ".join(sentences))


def _river(world: World, name: str) -> Document:
    river = world.rivers[name]
    sentences = [
        f"The {name} is {river.length_km} kilometres long.",
        f"It rises in the {river.source} and flows into the {river.mouth}.",
    ]
    return Document(name, " ".join(sentences))


def _company(world: World, name: str, rng: random.Random) -> Document:
    company = world.companies[name]
    sentences = [
        rng.choice(
            [
                f"{name} is a maker of {company.product}, founded in {company.founded} by {company.founder}.",
                f"{company.founder} founded {name} in {company.founded} to make {company.product}.",
            ]
        ),
        f"The company has its headquarters in {company.headquarters}.",
    ]
    return Document(name, " ".join(sentences))


def _invention(world: World, name: str) -> Document:
    invention = world.inventions[name]
    inventor = world.people[invention.inventor]
    text = (
        f"The {name} is a {invention.device} for {DEVICE_USES[invention.device]}. "
        f"It was invented in {invention.year} by {invention.inventor}, {_a(inventor.profession)}."
    )
    return Document(name, text)
