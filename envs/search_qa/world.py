"""A fictional world drawn from a seed: people, towns, rivers, companies and inventions with linked facts.

Every name is made of invented syllables, so no language model knows these facts beforehand:
answering needs retrieval. Only `random.Random(seed)` is used, whose integer methods give the
same draws on every Python version.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MIN_DOCUMENTS = 20
ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kl", "l", "m", "n", "p", "r", "s", "sh", "t", "th", "v"]
ONSETS += ["st", "z", "tr", "w"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "x", "ll"]
PROFESSIONS = ["chemist", "painter", "engineer", "botanist", "architect", "composer", "cartographer", "physician"]
PROFESSIONS += ["merchant", "astronomer", "clockmaker", "surveyor"]
PRODUCTS = ["glassware", "clocks", "textiles", "river barges", "paper", "oil lamps", "ink", "bicycles", "rope", "bells"]
COMPANY_KINDS = ["Works", "Foundry", "Mills", "Company", "Brothers", "Trading House"]
DEVICES = ["loom", "compass", "press", "valve", "kiln", "telescope", "pump", "lantern", "barometer", "sextant"]
DEVICE_USES = {
    "loom": "weaving patterned cloth",
    "compass": "finding north underground",
    "press": "printing maps in colour",
    "valve": "regulating steam in boilers",
    "kiln": "firing porcelain evenly",
    "telescope": "observing faint comets",
    "pump": "draining flooded mines",
    "lantern": "signalling between ships",
    "barometer": "forecasting mountain storms",
    "sextant": "measuring angles at sea",
}


@dataclass
class Person:
    name: str
    birth_year: int
    home_town: str
    profession: str
    companies: list[str] = field(default_factory=list)
    inventions: list[str] = field(default_factory=list)


@dataclass
class Town:
    name: str
    founded: int
    population: int
    province: str
    river: str


@dataclass
class River:
    name: str
    length_km: int
    source: str
    mouth: str


@dataclass
class Company:
    name: str
    founder: str
    founded: int
    headquarters: str
    product: str


@dataclass
class Invention:
    name: str
    inventor: str
    year: int
    device: str


@dataclass
class World:
    people: dict[str, Person]
    towns: dict[str, Town]
    rivers: dict[str, River]
    companies: dict[str, Company]
    inventions: dict[str, Invention]


def entity_counts(num_documents: int) -> dict[str, int]:
    """How many entities of each kind make `num_documents` passages (one passage per entity)."""
    if num_documents < MIN_DOCUMENTS:
        raise ValueError(f"search_qa needs num_documents >= {MIN_DOCUMENTS}, got {num_documents}")
    counts = {
        "rivers": num_documents * 8 // 100,
        "towns": num_documents * 20 // 100,
        "companies": num_documents * 17 // 100,
        "inventions": num_documents * 15 // 100,
    }
    counts["people"] = num_documents - sum(counts.values())
    return counts


class NameMaker:
    """Capitalised invented words, each handed out once."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        for _ in range(1000):
            parts = [self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(syllables)]
            word = ("".join(parts) + self.rng.choice(CODAS)).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word
        raise RuntimeError(f"ran out of unused {syllables}-syllable names; ask for fewer documents")


def make_world(seed: int, num_documents: int) -> World:
    """The world for `seed`: the same seed and size always give the same entities and facts."""
    counts = entity_counts(num_documents)
    rng = random.Random(seed)
    names = NameMaker(rng)
    first_names = [names.word(2) for _ in range(24)]
    provinces = [names.word(2) for _ in range(6)]
    seas = [f"{names.word(2)} Sea" for _ in range(4)]
    hills = [f"{names.word(2)} Hills" for _ in range(6)]

    rivers = {}
    for _ in range(counts["rivers"]):
        name = f"{names.word(1)} River"
        rivers[name] = River(name, rng.randint(40, 2400), rng.choice(hills), rng.choice(seas))

    towns = {}
    river_names = list(rivers)
    for _ in range(counts["towns"]):
        name = names.word(rng.choice([2, 3]))
        towns[name] = Town(
            name, rng.randint(900, 1750), rng.randint(2000, 900_000), rng.choice(provinces), rng.choice(river_names)
        )

    people = {}
    town_names = list(towns)
    for _ in range(counts["people"]):
        name = f"{rng.choice(first_names)} {names.word(rng.choice([2, 3]))}"
        people[name] = Person(name, rng.randint(1700, 1940), rng.choice(town_names), rng.choice(PROFESSIONS))

    companies = {}
    for founder in rng.sample(list(people), min(counts["companies"], len(people))):
        name = f"{names.word(2)} {rng.choice(COMPANY_KINDS)}"
        founded = people[founder].birth_year + rng.randint(20, 50)
        companies[name] = Company(name, founder, founded, rng.choice(town_names), rng.choice(PRODUCTS))
        people[founder].companies.append(name)

    inventions = {}
    for inventor in rng.sample(list(people), min(counts["inventions"], len(people))):
        device = rng.choice(DEVICES)
        name = f"{names.word(2)} {device}"
        inventions[name] = Invention(name, inventor, people[inventor].birth_year + rng.randint(18, 60), device)
        people[inventor].inventions.append(name)

    return World(people, towns, rivers, companies, inventions)
