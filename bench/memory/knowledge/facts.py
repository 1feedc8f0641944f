#!/usr/bin/env python3
"""facts.py — a corpus of facts about invented people, towns and workshops, in natural English, and probe
questions about them that the corpus never phrases: knowledge no pretrained LM can hold.

Every entity has an invented name (syllables drawn from a seeded generator; names are unique and checked not
to be common English words) and four facts:

    person    birth year, home town (a town entity), profession, number of works
    town      population, river (an invented name), region (a real one), trade
    workshop  founding year, founder (a person entity), town (a town entity), product

Each fact is stated three times, in different documents and words: in the entity's own article, in the
article of a related entity (a town's article names the people born there; a workshop's names its
founder's profession), and in a chronicle that lists facts of several entities. Retrieval that excludes a
chunk's own document still finds the fact elsewhere, as a datastore of real text would. Templates are
many per fact; probe templates (question form and cloze form) are a separate set that no corpus sentence
uses, and every probe also carries the sentence of the entity's article that states the fact (the
in-context reference pastes it before the prompt).

Unseen entities (--unseen N, 5 <= N <= --entities - 5): N of the --entities have facts the training never reads,
while the pipeline's datastore (the whole corpus) still holds them. They form a world of their own, drawn from the
seed after the others by the same generator (the same mix of towns, people and workshops, the same value ranges,
names unique across both; exactly N, which whole families picked from one world could not promise): every relation
of an unseen entity (home town, founder, workshop's town) and every article that hosts its facts is unseen too, so
no unseen name appears in a document before them. Their documents (articles and chronicles: all three statements of
each of their facts) come after every document of the seen entities, so the last documents of the corpus -- the
last sequences of a run built from it in order -- are exactly the unseen tail; holding those sequences out of
training (bench/memory/knowledge/held_out.py) leaves the unseen entities unread. A seen entity keeps all three
statements of every fact in the head (asserted): seen facts are read as often as without --unseen, so seen against
unseen is meant to differ in whether training read the fact, not in how often. Each probe then carries "unseen":
true/false, and DIR/unseen.json records the split ({"unseen_entities", "head_documents", "documents",
"first_unseen_document", "head_characters", "tail_characters"}). --unseen 0 (the default) writes exactly what the
script wrote before the option existed, with no "unseen" field and no unseen.json.

    python3 bench/memory/knowledge/facts.py --out DIR [--entities 240] [--seed 1] [--unseen 0]
writes DIR/corpus.jsonl ({"id", "text"}) and DIR/probes.jsonl ({"id", "entity", "kind", "fact", "answer",
"question", "cloze", "evidence"[, "unseen"]}). Deterministic for a seed.
"""
import argparse
import json
import os
import random
import re

ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "th", "v", "w",
          "z", "sh"]
NUCLEI = ["a", "e", "i", "o", "u", "a", "e", "o", "ea", "ai", "y"]
CODAS = ["", "", "", "", "n", "r", "l", "s", "m"]
ENDINGS = ["", "", "ett", "in", "ard", "ow", "ell", "ick", "an", "ey"]
TOWN_SUFFIX = ["wick", "ford", "holm", "stead", "mere", "bury", "thorpe", "vale", "haven", "moor"]
PROFESSIONS = ["botanist", "clockmaker", "cartographer", "violinist", "architect", "chemist", "novelist", "engineer",
               "astronomer", "glassblower", "bookbinder", "shipwright", "painter", "surveyor", "physician", "weaver"]
WORKS = {"botanist": "herbaria", "clockmaker": "clocks", "cartographer": "maps", "violinist": "sonatas",
         "architect": "buildings", "chemist": "papers", "novelist": "novels", "engineer": "bridges",
         "astronomer": "star charts", "glassblower": "windows", "bookbinder": "bound volumes", "shipwright": "ships",
         "painter": "portraits", "surveyor": "surveys", "physician": "treatises", "weaver": "tapestries"}
REGIONS = ["Bavaria", "Tuscany", "Brittany", "Galicia", "Moravia", "Silesia", "Flanders", "Andalusia", "Wessex",
           "Lapland", "Anatolia", "Patagonia", "Bohemia", "Normandy", "Saxony", "Catalonia"]
TRADES = ["cheese", "lace", "copper", "wool", "salt", "barley", "timber", "pottery", "cider", "linen", "honey",
          "leather"]
PRODUCTS = ["barometers", "telescopes", "pianos", "bicycles", "typewriters", "compasses", "lanterns", "sewing machines",
            "printing presses", "music boxes", "looms", "microscopes"]
COMMON = set("the and for are but not you all any can had her was one our out day get has him his how man new now old see "
             "two way who boy did its let put say she too use".split())

# corpus templates: {n} name; the fact's value by its key. Several per fact, none used by a probe.
CORPUS = {
    "birth_year": ["{n} was born in {v}.", "Born in {v}, {n} spent a quiet childhood.", "The year {v} saw the birth of {n}.",
                   "{n}, who was born in {v}, rarely spoke of those early years."],
    "home_town": ["{n} grew up in the town of {v}.", "Most of the life of {n} was spent in {v}.",
                  "{n} lived for decades in {v}.", "In {v}, {n} kept a small house near the market."],
    "profession": ["{n} worked as a {v}.", "By trade, {n} was a {v}.", "{n} earned a living as a {v}.",
                   "Those who knew {n} remember a careful {v}."],
    "works": ["Over a long career {n} completed {v}.", "{n} left behind {v}.", "In all, {n} made {v}.",
              "The catalogue of {n} lists {v}."],
    "population": ["{n} has {v} inhabitants.", "About {v} people live in {n}.", "The population of {n} is {v}.",
                   "{n} is home to {v} residents."],
    "river": ["{n} lies on the river {v}.", "The river {v} runs through {n}.", "{n} grew up along the banks of the {v}.",
              "Boats on the {v} still stop at {n}."],
    "region": ["{n} is a town in {v}.", "{n} sits in the hills of {v}.", "Travellers reach {n} through {v}.",
               "Of all the towns of {v}, {n} is the oldest."],
    "trade": ["{n} is known for its {v}.", "The {v} of {n} is sold far away.", "For centuries {n} has traded in {v}.",
              "Every autumn {n} holds a fair for its {v}."],
    "founded": ["{n} was founded in {v}.", "The workshop {n} opened its doors in {v}.", "Since {v}, {n} has been in business.",
                "{n} dates back to {v}."],
    "founder": ["{n} was founded by {v}.", "{v} started {n}.", "The founder of {n} was {v}.",
                "It was {v} who set up {n}."],
    "town": ["{n} is based in {v}.", "The workshop {n} stands in {v}.", "{n} has always worked from {v}.",
             "Visitors find {n} in the centre of {v}."],
    "product": ["{n} makes {v}.", "The {v} of {n} are prized by collectors.", "{n} builds {v} by hand.",
                "Most of what {n} sells are {v}."],
}
# probe templates: a question form and a cloze form per fact, worded unlike any corpus sentence; the answer
# follows the prompt after one space
PROBES = {
    "birth_year": ("In what year did {n} come into the world? Answer:", "Records give the year of birth of {n} as"),
    "home_town": ("Which town was home to {n}? Answer:", "The town where {n} resided is called"),
    "profession": ("What was the occupation of {n}? Answer: a", "The occupation of {n} was that of a"),
    "works": ("How many pieces did {n} produce? Answer:", "The number of finished works by {n} is"),
    "population": ("How many residents does {n} count? Answer:", "The number of residents counted in {n} is"),
    "river": ("Which river flows past {n}? Answer: the", "The waterway that passes {n} is the"),
    "region": ("In which region is {n} located? Answer:", "The region containing {n} is"),
    "trade": ("What product is {n} famous for? Answer:", "The product for which {n} is famous is"),
    "founded": ("In what year was {n} established? Answer:", "The year of establishment of {n} is"),
    "founder": ("Who established {n}? Answer:", "The person who established {n} is"),
    "town": ("In which town is {n} located? Answer:", "The town that houses {n} is"),
    "product": ("What does {n} manufacture? Answer:", "The goods manufactured by {n} are"),
}
FILLER = ["Local records from the period are incomplete.", "Much of this account comes from parish registers.",
          "The details below were gathered from letters and ledgers.", "Later historians have added little to it.",
          "A few facts are certain.", "The archive holds several accounts of this."]


class Names:
    def __init__(self, rng):
        self.rng, self.used = rng, set()

    def word(self, syllables):
        while True:
            w = "".join(self.rng.choice(ONSETS) + self.rng.choice(NUCLEI) + self.rng.choice(CODAS)
                        for _ in range(syllables)) + self.rng.choice(ENDINGS)
            if len(w) >= 4 and w not in COMMON and w not in self.used:
                self.used.add(w)
                return w.capitalize()

    def person(self):
        return f"{self.word(self.rng.choice([1, 2]))} {self.word(2)}"

    def town(self):
        return self.word(1) + self.rng.choice(TOWN_SUFFIX)

    def workshop(self, founder_last):
        return f"{founder_last} & {self.word(2)}"


def world(names, rng, n_entities):
    """Towns, people and workshops whose relations (home town, founder, workshop's town) stay among them."""
    n_towns = max(2, n_entities // 4)
    n_people = max(2, n_entities // 2)
    n_shops = max(1, n_entities - n_towns - n_people)
    towns = [{"kind": "town", "name": names.town()} for _ in range(n_towns)]
    for t in towns:
        t["facts"] = {"population": str(rng.randint(800, 98000)),
                      "river": names.word(2), "region": rng.choice(REGIONS), "trade": rng.choice(TRADES)}
    people = [{"kind": "person", "name": names.person()} for _ in range(n_people)]
    for p in people:
        prof = rng.choice(PROFESSIONS)
        p["facts"] = {"birth_year": str(rng.randint(1712, 1931)), "home_town": rng.choice(towns)["name"],
                      "profession": prof, "works": f"{rng.randint(3, 97)} {WORKS[prof]}"}
    shops = []
    for _ in range(n_shops):
        founder = rng.choice(people)
        s = {"kind": "workshop", "name": names.workshop(founder["name"].split()[-1])}
        s["facts"] = {"founded": str(int(founder["facts"]["birth_year"]) + rng.randint(22, 50)),
                      "founder": founder["name"], "town": rng.choice(towns)["name"], "product": rng.choice(PRODUCTS)}
        shops.append(s)
    return towns + people + shops


def build(n_entities, seed, unseen=0):
    """(seen entities, unseen entities, rng): without unseen, one world of n_entities (the draws of the script
    before --unseen existed); with it, a world of n_entities - unseen, then a world of its own of unseen."""
    rng = random.Random(seed)
    names = Names(rng)
    if not unseen:
        return world(names, rng, n_entities), [], rng
    seen = world(names, rng, n_entities - unseen)
    hidden = world(names, rng, unseen)
    assert len(hidden) == unseen, (len(hidden), unseen)
    return seen, hidden, rng


def sentence(rng, fact, name, value, avoid=None):
    choices = [t for t in CORPUS[fact] if t != avoid]
    t = rng.choice(choices)
    return t.format(n=name, v=value), t


def documents(entities, rng, tag=""):
    """Three statements of every fact in three documents: the entity's article, a related entity's article,
    a chronicle (ids chronicle-TAG0000, ...). Returns the documents, per (entity, fact) the article sentence (the
    evidence), and per (entity, fact) its three statements."""
    articles = {e["name"]: [rng.choice(FILLER)] for e in entities}
    evidence = {}
    used = {}
    stated = {}
    for e in entities:
        for fact, value in e["facts"].items():
            s, t = sentence(rng, fact, e["name"], value)
            articles[e["name"]].append(s)
            evidence[(e["name"], fact)] = s
            used[(e["name"], fact)] = [t]
            stated[(e["name"], fact)] = [s]
    # the related article: a person's facts in their home town's article, a workshop's in its founder's, a town's
    # in the article of a workshop there (or of a person living there)
    for e in entities:
        f = e["facts"]
        if e["kind"] == "person":
            host = f["home_town"]
        elif e["kind"] == "workshop":
            host = f["founder"]
        else:
            there = [x["name"] for x in entities if x["kind"] != "town" and e["name"] in x["facts"].values()]
            host = rng.choice(there) if there else rng.choice([x["name"] for x in entities if x is not e])
        for fact, value in f.items():
            s, t = sentence(rng, fact, e["name"], value, avoid=used[(e["name"], fact)][0])
            articles[host].append(s)
            used[(e["name"], fact)].append(t)
            stated[(e["name"], fact)].append(s)
    docs = []
    for name, sents in articles.items():
        body = [sents[0]] + rng.sample(sents[1:], len(sents) - 1)
        docs.append({"id": "article-" + name.lower().replace(" ", "-").replace("&", "and"), "text": " ".join(body)})
    # chronicles: every fact once more, eight per chronicle, in a third wording
    pending = [(e["name"], fact, value) for e in entities for fact, value in e["facts"].items()]
    rng.shuffle(pending)
    for i in range(0, len(pending), 8):
        sents = []
        for name, fact, value in pending[i:i + 8]:
            rest = [t for t in CORPUS[fact] if t not in used[(name, fact)]]
            sents.append(rng.choice(rest).format(n=name, v=value))
            stated[(name, fact)].append(sents[-1])
        docs.append({"id": f"chronicle-{tag}{i // 8:04d}", "text": "From the chronicle: " + " ".join(sents)})
    rng.shuffle(docs)
    return docs, evidence, stated


def check_split(seen, hidden, head, tail, stated):
    """The unseen tail holds every statement of the unseen entities' facts and the head none of their names; the
    head holds all three statements of every seen entity's fact. Raises AssertionError otherwise."""
    head_text, tail_text = " ".join(d["text"] for d in head), " ".join(d["text"] for d in tail)
    for e in hidden:
        assert not re.search(r"\b%s\b" % re.escape(e["name"]), head_text), "unseen %s named before the tail" % e["name"]
    for es, text in ((hidden, tail_text), (seen, head_text)):
        for e in es:
            for fact in e["facts"]:
                st = stated[(e["name"], fact)]
                assert len(st) == 3 and all(s in text for s in st), (e["name"], fact, st)


def probes(entities, evidence, hidden=None):
    out = []
    for e in entities:
        for fact, value in e["facts"].items():
            q, c = PROBES[fact]
            answer = value
            for prefix in ("the ", "a "):  # the prompt already says "the" / "a"
                if q.endswith(prefix.strip()) and answer.startswith(prefix):
                    answer = answer[len(prefix):]
            out.append({"id": f"{len(out):05d}", "entity": e["name"], "kind": e["kind"], "fact": fact, "answer": answer,
                        "question": q.format(n=e["name"]), "cloze": c.format(n=e["name"]),
                        "evidence": evidence[(e["name"], fact)]})
            if hidden is not None:  # only with --unseen: without it the probes are as before the option
                out[-1]["unseen"] = e["name"] in hidden
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--entities", type=int, default=240)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--unseen", type=int, default=0, help="entities whose documents all come last (0, or 5 to "
                    "--entities - 5): a run's last sequences, held out of training")
    a = ap.parse_args()
    if a.unseen and not 5 <= a.unseen <= a.entities - 5:
        ap.error("--unseen %d: 0, or 5 to --entities - 5 (%d); the unseen and the seen entities are each a world of "
                 "towns, people and workshops" % (a.unseen, a.entities - 5))
    seen, hidden, rng = build(a.entities, a.seed, a.unseen)
    entities = seen + hidden
    docs, evidence, stated = documents(seen, rng)
    head = len(docs)
    if hidden:
        tail, ev, st = documents(hidden, rng, "unseen-")
        check_split(seen, hidden, docs, tail, {**stated, **st})
        docs += tail
        evidence.update(ev)
    pr = probes(entities, evidence, {e["name"] for e in hidden} if hidden else None)
    corpus_text = " ".join(d["text"] for d in docs)
    for p in pr:  # no probe wording appears in the corpus
        assert p["question"].split(" Answer:")[0] not in corpus_text and p["cloze"] not in corpus_text, p
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "corpus.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    with open(os.path.join(a.out, "probes.jsonl"), "w") as f:
        for p in pr:
            f.write(json.dumps(p) + "\n")
    note = ""
    if hidden:
        split = {"unseen_entities": [e["name"] for e in hidden], "head_documents": head, "documents": len(docs),
                 "first_unseen_document": docs[head]["id"],
                 "head_characters": len(" ".join(d["text"] for d in docs[:head])),
                 "tail_characters": len(" ".join(d["text"] for d in docs[head:]))}
        with open(os.path.join(a.out, "unseen.json"), "w") as f:
            json.dump(split, f, indent=1)
        note = (f"; unseen: {len(hidden)} entities, the last {len(docs) - head} documents "
                f"({split['tail_characters']} characters)")
    print(f"facts: {len(entities)} entities, {len(docs)} documents ({len(corpus_text)} characters), {len(pr)} probes "
          f"-> {a.out}{note}")


if __name__ == "__main__":
    main()
