"""Passage phrasing: fact sentences (direct and indirect), vague and filler sentences, mentions.

Placeholders: {S}/{s} the subject, sentence-initial / inside (full name the first time in a
passage, later a pronoun, surname or "the novel"); {Pos}/{pos} its possessive; {he}/{his} always a
pronoun (only where the name already appeared in the sentence); {T} another entity's name (mention
sentences); the other slots are the subject's fact values (see :func:`slots`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from cosearch_lib.world.entities import FORMAL, OCCUPATIONS, ORG_KINDS, WORK_KINDS, Entity
from cosearch_lib.world.names import TITLE_ADJ, TITLE_NOUN, article, article_year

# Phrasings per fact group, worded like the questions ask ("born in", "founded by").
FACT_TEMPLATES: dict[tuple[str, str], list[str]] = {
    ("person", "occupation+nationality"): [
        "{S} was {a_occupation} from {nationality}.",
        "{S} was {a_occupation} who held the citizenship of {nationality}.",
        "A citizen of {nationality}, {s} worked as {a_occupation} for most of {his} life."],
    ("person", "birth_year+birthplace"): [
        "{S} was born in {birthplace} in {birth_year}.",
        "{S} was born in {birth_year} in the city of {birthplace}.",
        "Records show that {s} was born in {birthplace} in the year {birth_year}."],
    ("person", "occupation+nationality+birth_year"): [
        "{S} (born {birth_year}) was {a_occupation} from {nationality}.",
        "{S}, born in {birth_year}, was {a_occupation} and a citizen of {nationality}."],
    ("person", "birthplace"): [
        "{S} was born in the city of {birthplace}.",
        "{Pos} birthplace was {birthplace}.",
        "{S} was a native of {birthplace}, where {he} was born."],
    ("person", "member_of"): [
        "{S} later joined {member_of}.",
        "For many years {s} worked for {member_of}.",
        "{S} was a long-standing member of {member_of}."],
    ("person", "work"): [
        "{S} {made} the {kind} {title}.",
        "Among {pos} works is the {kind} {title}.",
        "One of the best-known works of {s} is the {kind} {title}."],
    ("person", "spouse"): [
        "{S} married {spouse}.",
        "{S} was married to {spouse}.",
        "{Pos} spouse was {spouse}."],
    ("work", "year+genre"): [
        "{S} is {a_year} {genre} {kind}.",
        "{S} is a {genre} {kind} first {released} in {year}.",
        "First {released} in {year}, {s} is {a_genre} {kind}."],
    ("work", "creator"): [
        "{S} was {made_pp} by {creator}.",
        "{creator} {made} {s}.",
        "{Pos} {role} was {creator}."],
    ("org", "headquarters"): [
        "{S} is {a_kind} headquartered in {headquarters}.",
        "{S} is {a_kind} based in {headquarters}.",
        "{S}, {a_kind}, has its headquarters in {headquarters}."],
    ("org", "founded_year"): [
        "{S} was founded in {founded_year}.",
        "{S} was established in {founded_year}.",
        "{Pos} history begins in {founded_year}, the year it was founded."],
    ("org", "founded_by"): [
        "{S} was founded by {founded_by}.",
        "{founded_by} founded {s}.",
        "{Pos} founder was {founded_by}."],
    ("city", "country"): [
        "{S} is a city in {country}.",
        "{S} is a city located in {country}.",
        "{S} is one of the cities of {country}."],
    ("city", "population"): [
        "{S} has a population of {population}.",
        "{Pos} population is {population}.",
        "About {population} people live in {s}."],
    ("city", "founded_year"): [
        "{S} was founded in {founded_year}.",
        "{S} received its town charter in {founded_year}.",
        "{Pos} founding is dated to {founded_year}."],
    ("country", "lead"): [
        "{S}, officially the {formal}, is a sovereign state.",
        "{S} (officially the {formal}) is a country."],
    ("country", "capital"): [
        "The capital of {s} is {capital}.",
        "{S} is governed from its capital, {capital}.",
        "{Pos} capital and seat of government is {capital}."],
    ("country", "language"): [
        "The official language of {s} is {language}.",
        "{S} has {language} as its official language.",
        "Most people in {s} speak {language}, the official language."],
}
# Near-duplicates "with the key fact missing" swap one fact sentence for one of these: it still
# names the subject (so it looks relevant) but states nothing askable.
VAGUE: dict[tuple[str, str], str] = {
    ("person", "occupation+nationality"): "{S} is remembered mainly through the accounts of others.",
    ("person", "birth_year+birthplace"): "Sources disagree about the date and place of {pos} birth.",
    ("person", "occupation+nationality+birth_year"): "{S} is a figure about whom surprisingly little is certain.",
    ("person", "birthplace"): "Sources disagree about where {s} was born.",
    ("person", "member_of"): "{S} was associated with several institutions over the years.",
    ("person", "work"): "{S} produced a number of works that are now hard to find.",
    ("person", "spouse"): "{Pos} private life is only sparsely documented.",
    ("work", "year+genre"): "{S} is {a_kind_w} whose first appearance is poorly documented.",
    ("work", "creator"): "The origins of {s} have occasionally been discussed by critics.",
    ("org", "headquarters"): "{S} is {a_kind} that has moved its offices more than once.",
    ("org", "founded_year"): "The exact founding date of {s} is uncertain.",
    ("org", "founded_by"): "Accounts of who established {s} differ.",
    ("city", "country"): "{S} is a city with a long regional history.",
    ("city", "population"): "The population of {s} has changed considerably over time.",
    ("city", "founded_year"): "The origins of {s} are obscure.",
    ("country", "capital"): "{S} has a centralised system of government.",
    ("country", "language"): "Several languages are spoken in {s}.",
}
# Neutral sentences that pad passages to a realistic length and state no fact.
FILLERS: dict[str, list[str]] = {
    "person": [
        "{S} was known among colleagues for a patient and meticulous working method.",
        "{S} rarely gave interviews and left behind only a small collection of letters.",
        "{Pos} early years are poorly documented, and several accounts of them conflict.",
        "Contemporary critics described {pos} approach as careful, restrained and deliberate.",
        "{S} travelled widely and kept detailed notebooks on each journey.",
        "{Pos} correspondence with friends survives in several private collections.",
        "Later biographers argued that {pos} influence had long been underestimated.",
        "{S} took on a number of students, some of whom became well known in their own right.",
        "{S} spent long periods working in near isolation.",
        "{Pos} reputation grew slowly, mostly through word of mouth.",
        "A small memorial plaque marks one of the houses where {s} lived.",
        "{S} was noted for a dry sense of humour and a dislike of ceremony."],
    "work": [
        "{S} received mixed reviews when it first appeared.",
        "Critics later praised {pos} careful structure and restrained tone.",
        "{S} has been reissued several times.",
        "{Pos} reception improved considerably in later decades.",
        "Several scholars have written about {pos} recurring themes of memory and loss.",
        "{S} was translated into a number of languages.",
        "Younger artists often cite {s} as an early influence.",
        "{S} sold modestly at first but gained a devoted following.",
        "Some early copies of {s} differ slightly from the standard edition.",
        "{S} is frequently included in lists of overlooked classics.",
        "{Pos} opening section is often quoted."],
    "org": [
        "{S} grew steadily during its first decades.",
        "{Pos} archives are open to researchers by appointment.",
        "{S} has gone through several reorganisations.",
        "{S} is governed by a board of trustees.",
        "Over time, {s} expanded its activities well beyond its original purpose.",
        "{S} has been the subject of several institutional histories.",
        "{Pos} main building was renovated after a fire.",
        "{S} maintains a small public collection.",
        "Former employees of {s} include several notable figures.",
        "{S} publishes a short annual report on its activities."],
    "city": [
        "{S} is known for its narrow streets and old market square.",
        "{Pos} economy has traditionally relied on trade and crafts.",
        "{S} hosts a weekly market that draws visitors from the surrounding region.",
        "Several bridges cross the river that runs through {s}.",
        "{Pos} old town contains a number of well-preserved buildings.",
        "{S} has a mild climate with wet winters.",
        "{S} grew rapidly after the arrival of the railway.",
        "A number of small museums are located in {s}.",
        "{S} is surrounded by farmland and low wooded hills.",
        "{Pos} central square is lined with cafes and civic buildings."],
    "country": [
        "{S} has a varied landscape of hills, rivers and coastal plains.",
        "{Pos} economy is based largely on agriculture, trade and fishing.",
        "{S} is divided into several provinces.",
        "{S} has a long tradition of folk music and storytelling.",
        "{S} is known for its mountain villages and terraced fields.",
        "{Pos} national holiday is celebrated each spring.",
        "{S} maintains a small standing army and a coast guard.",
        "Rail lines connect the main towns of {s}.",
        "{Pos} parliament meets in a restored palace."],
    "distractor": [
        "The occasion attracted visitors from several neighbouring regions.",
        "Local newspapers covered it in some detail at the time.",
        "Organisers described it as a modest but lively affair.",
        "Contemporary accounts differ on several details.",
        "A short printed programme survives in a regional library.",
        "Few photographs of it are known to exist.",
        "It is mentioned only briefly in most reference works.",
        "Later commentators have questioned how much influence it really had."],
}
EVENT_KINDS = ["Festival", "Book Fair", "Congress", "Exhibition", "Regatta", "Music Week"]
# The same facts worded unlike the questions (the lexical gap of real articles): used for a
# share ``WorldConfig.indirect_rate`` of fact sentences.
INDIRECT_TEMPLATES: dict[tuple[str, str], list[str]] = {
    ("person", "occupation+nationality"): [
        "{S} made a living as {a_occupation} and carried the passport of {nationality}.",
        "{S}, {a_occupation} by profession, was a national of {nationality}."],
    ("person", "birth_year+birthplace"): [
        "{Pos} life began in {birthplace} in {birth_year}.",
        "{S} came into the world in {birth_year}, in {birthplace}."],
    ("person", "occupation+nationality+birth_year"): [
        "{S} ({birth_year}) made a living as {a_occupation} and carried the passport of {nationality}."],
    ("person", "birthplace"): [
        "{S} grew up in {birthplace}, the city of {his} birth.",
        "{Pos} home town, where {his} life began, was {birthplace}."],
    ("person", "member_of"): [
        "{S} spent much of {his} working life at {member_of}.",
        "{S} was on the staff of {member_of}."],
    ("person", "work"): [
        "{S} is credited with the {kind} {title}.",
        "The {kind} {title} is among the achievements of {s}."],
    ("person", "spouse"): [
        "{S} wed {spouse} in a quiet ceremony.",
        "{Pos} partner in marriage was {spouse}."],
    ("work", "year+genre"): [
        "{S} reached the public in {year} as {a_genre} {kind}.",
        "Audiences first met {s}, {a_genre} {kind}, in {year}."],
    ("work", "creator"): [
        "{S} is the work of {creator}.",
        "{S} is credited to {creator}."],
    ("org", "headquarters"): [
        "{S} is {a_kind} whose main offices stand in {headquarters}.",
        "{S}, {a_kind}, keeps its main offices in {headquarters}."],
    ("org", "founded_year"): [
        "{S} opened its doors in {founded_year}.",
        "{S} dates from {founded_year}."],
    ("org", "founded_by"): [
        "{S} owes its existence to {founded_by}.",
        "{S} was set up by {founded_by}."],
    ("city", "country"): [
        "{S} lies within the borders of {country}.",
        "{S} belongs to {country}."],
    ("city", "population"): [
        "{S} is home to {population} residents.",
        "{S} counts {population} inhabitants."],
    ("city", "founded_year"): [
        "{S} dates back to {founded_year}.",
        "The first settlement at {s} goes back to {founded_year}."],
    ("country", "capital"): [
        "{capital} serves as the seat of government of {s}.",
        "Government business in {s} is conducted from {capital}."],
    ("country", "language"): [
        "Public life in {s} is conducted in {language}.",
        "Schools and courts in {s} use {language}."],
}
# Incoming mentions (hard negatives): a sentence of a *partner* entity that states the partner's
# own value of a relation, in the words a question about that relation uses, and names another
# entity {T} of the same type. For a search about {T}'s fact it looks relevant (the name and the
# relation's words) but holds a different value. Keyed by (type, relation); the tails never
# claim a fact about {T}.
MENTION_TEMPLATES: dict[tuple[str, str], list[str]] = {
    ("person", "birthplace"): [
        "{S} was born in {birthplace} and later apprenticed with {T}.",
        "Born in {birthplace}, {s} became a close friend of {T}.",
        "{S}, who was born in the city of {birthplace}, corresponded with {T} for many years."],
    ("person", "birth_year"): [
        "{S} was born in {birth_year} and in later life wrote a memoir of {T}.",
        "Born in {birth_year}, {s} was often compared with {T}.",
        "{S}, born in {birth_year}, studied the early work of {T}."],
    ("person", "occupation"): [
        "{S} worked as {a_occupation} and was a rival of {T}.",
        "As {a_occupation}, {s} admired the work of {T}.",
        "The occupation of {s} was that of {a_occupation}, and {he} often quarrelled with {T}."],
    ("person", "nationality"): [
        "{S}, a citizen of {nationality}, corresponded with {T}.",
        "{S} held the citizenship of {nationality} and befriended {T}.",
        "{S} was from {nationality} and once shared a stage with {T}."],
    ("person", "spouse"): [
        "{S} married {spouse} in a ceremony attended by {T}.",
        "{S} was married to {spouse}, a distant cousin of {T}.",
        "{Pos} spouse was {spouse}, whom {he} met through {T}."],
    ("person", "member_of"): [
        "{S} joined {member_of} on the advice of {T}.",
        "{S} worked for {member_of} and often wrote to {T}.",
        "For many years {s} worked for {member_of}, where {he} translated letters of {T}."],
    ("work", "creator"): [
        "{S} was {made_pp} by {creator} and is often compared with {T}.",
        "{creator} {made} {s} partly as a reply to {T}.",
        "{Pos} {role} was {creator}, an admirer of {T}."],
    ("work", "year"): [
        "{S} was first {released} in {year}, and critics soon compared it with {T}.",
        "First {released} in {year}, {s} borrows a famous scene from {T}."],
    ("work", "genre"): [
        "{S} is {a_genre} {kind} that is often discussed alongside {T}.",
        "{S} is {a_genre} {kind} whose title echoes {T}."],
    ("org", "founded_by"): [
        "{S} was founded by {founded_by}, who modelled it on {T}.",
        "{founded_by} founded {s} as a rival to {T}."],
    ("org", "founded_year"): [
        "{S} was founded in {founded_year} as a rival to {T}.",
        "{S} was established in {founded_year}, partly modelled on {T}."],
    ("org", "headquarters"): [
        "{S} is headquartered in {headquarters} and has long competed with {T}.",
        "{S}, based in {headquarters}, signed a lasting agreement with {T}."],
    ("city", "country"): [
        "{S} is a city in {country} that is twinned with {T}.",
        "{S}, a city located in {country}, has long traded with {T}."],
    ("city", "population"): [
        "{S} has a population of {population} and lies on the old road to {T}.",
        "About {population} people live in {s}, a rival of {T}."],
    ("city", "founded_year"): [
        "{S} was founded in {founded_year} by settlers from {T}.",
        "{S} was founded in {founded_year} by merchants who traded with {T}."],
    ("country", "capital"): [
        "{S}, whose capital is {capital}, has close ties to {T}.",
        "The capital of {s} is {capital}, a city with old trade links to {T}."],
    ("country", "language"): [
        "{S}, whose official language is {language}, borders {T}.",
        "The official language of {s} is {language}, and {s} has long traded with {T}."],
}

# Titles and opening sentences of mention passages: pages *about* an entity's associates, so the
# title names the entity, as "Students of ..." or "Twin towns of ..." pages do.
MENTION_PAGES: dict[str, list[tuple[str, str]]] = {
    "person": [("Circle of {T}", "The circle of {T} is the name later given to the people who knew or worked with {T}."),
               ("Students of {T}", "Several younger figures are remembered as students or followers of {T}."),
               ("Letters of {T}", "The surviving letters of {T} name many friends, rivals and correspondents."),
               ("{T} Society", "The {T} Society keeps records of the people connected with {T}.")],
    "work": [("Reception of {T}", "The reception of {T} is often traced through the works that answered it."),
             ("Works inspired by {T}", "A number of later works have been described as inspired by {T}.")],
    "org": [("Rivals of {T}", "Over the years {T} has had several rivals and partners."),
            ("Partners of {T}", "Several institutions have worked alongside {T} or competed with it.")],
    "city": [("Twin towns of {T}", "{T} keeps formal and informal ties with a number of other towns."),
             ("Trade routes of {T}", "Old trade routes link {T} with several other towns.")],
    "country": [("Foreign relations of {T}", "{T} maintains relations with several neighbouring states.")],
}


def template_words() -> set[str]:
    """Every word the templates can print: generated names must avoid them (see names.Namer)."""
    texts = [t for table in (FACT_TEMPLATES, FILLERS, INDIRECT_TEMPLATES, MENTION_TEMPLATES)
             for ts in table.values() for t in ts]
    texts += list(VAGUE.values()) + [t for pages in MENTION_PAGES.values() for page in pages for t in page]
    texts += [w for kind in WORK_KINDS.values() for v in kind.values() for w in ([v] if isinstance(v, str) else v)]
    texts += list(OCCUPATIONS) + [k for k, _, sfx in ORG_KINDS for k in [k, *sfx]] + FORMAL + EVENT_KINDS
    texts += TITLE_ADJ + TITLE_NOUN
    return {w for t in texts for w in re.findall(r"[a-z]+", re.sub(r"\{[^}]*\}", " ", t).lower())}


def slots(ents: dict[str, Entity], e: Entity, ref: Callable[[Entity], str] = lambda x: x.name) -> dict[str, str]:
    """Values the templates of entity e can print; ``ref`` names a related entity (questions pass
    one that disambiguates namesakes)."""
    a, info = e.attrs, e.info
    name = lambda k: ref(ents[a[k]]) if a.get(k) else ""  # noqa: E731
    he, his = ("he", "his") if info.get("gender") == "m" else ("she", "her") if e.type == "person" else ("it", "its")
    out = {"he": he, "his": his}
    if e.type == "person":
        out.update(occupation=a["occupation"], a_occupation=article(a["occupation"]), nationality=name("nationality"),
                   birth_year=str(a["birth_year"]), birthplace=name("birthplace"), member_of=name("member_of"),
                   spouse=name("spouse"))
    elif e.type == "work":
        spec = WORK_KINDS[info["kind"]]
        out.update({k: v for k, v in spec.items() if isinstance(v, str)}, kind=info["kind"],
                   a_kind_w=article(info["kind"]), year=str(a["year"]), a_year=article_year(a["year"]),
                   genre=a["genre"], a_genre=article(a["genre"]), creator=name("creator"))
    elif e.type == "org":
        out.update(kind=info["kind"], a_kind=article(info["kind"]), founded_year=str(a["founded_year"]),
                   founded_by=name("founded_by"), headquarters=name("headquarters"))
    elif e.type == "city":
        out.update(country=name("country"), population=f"{a['population']:,}", founded_year=str(a["founded_year"]))
    else:
        out.update(formal=info["formal"], capital=name("capital"), language=a["language"])
    return out


def refs(e: Entity, first: bool, rng: random.Random) -> dict[str, str]:
    """How a sentence names its subject: in full the first time, then as a reader would expect."""
    if first:
        return {"S": e.name, "s": e.name, "Pos": e.name + "'s", "pos": e.name + "'s"}
    if e.type == "person":
        if rng.random() < 0.6:
            he, his = ("he", "his") if e.info["gender"] == "m" else ("she", "her")
            return {"S": he.capitalize(), "s": he, "Pos": his.capitalize(), "pos": his}
        sur = e.info["surname"]
        return {"S": sur, "s": sur, "Pos": sur + "'s", "pos": sur + "'s"}
    noun = {"work": e.info.get("kind"), "org": e.info.get("short"), "city": "city", "country": "country"}[e.type]
    return {"S": f"The {noun}", "s": f"the {noun}", "Pos": "Its", "pos": "its"}


def sentence(template: str, values: dict[str, str]) -> str:
    s = template.format(**values)
    return s[0].upper() + s[1:]
