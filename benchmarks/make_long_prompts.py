#!/usr/bin/env python3
"""The gate prompt set's long-context slice: passages of ordinary English with facts, a question about an early one.

    .venv/bin/python benchmarks/make_long_prompts.py [--count 16] [--paragraphs 5] > /tmp/long.jsonl

Each case is self-contained: a made-up place (so the answer can only come from the passage, not from what the
model knows), its facts in the first paragraph, then everyday paragraphs about the town that do not touch those
facts, then a question whose answer is in the first paragraph. A rope or position breakage (rope theta altered,
a position-id off by some offset) hardly shows in ~40-token prompts and does at a few hundred tokens of
distance (docs/smoke-gate.md, "Long-context slice"). Deterministic: the same arguments write the same bytes.
The output lines carry `"slice": "long-context"` and are appended to benchmarks/gate_prompts.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

TOWNS = ["Karvik", "Elmsworth", "Dunmore Bay", "Halloway", "Brenford", "Ostrava Mill", "Linden Cross", "Marrowby",
         "Saltmere", "Corrington", "Wexley", "Fennick", "Tarrow", "Ashgrove", "Pellham", "Rookwater"]
PEOPLE = ["Marta Olsen", "Edwin Pryce", "Clara Whitlock", "Tomas Brandt", "Agnes Holloway", "Ruben Castell",
          "Ida Lindqvist", "Samuel Okafor", "Helena Marsh", "Oskar Vale", "Beatrice Lowell", "Felix Armitage",
          "Nora Castellan", "Jonas Reed", "Lydia Fenwick", "Hugo Demarest"]
RIVERS = ["Tamsin", "Orrel", "Wend", "Callow", "Brisk", "Ellery", "Stour", "Merrow"]
COLOURS = ["green", "red", "blue", "yellow", "white", "grey", "orange", "black"]
# (what, founding verb, countable thing, its unit)
THINGS = [
    ("lighthouse", "built", "steps", "steps lead up to the lamp room"),
    ("public library", "founded", "books", "books were on its shelves on the day it opened"),
    ("stone bridge", "built", "arches", "arches carry it across the river"),
    ("bakery", "opened", "ovens", "ovens were fired every morning in its first year"),
    ("observatory", "founded", "telescopes", "telescopes stood in its dome"),
    ("ferry company", "founded", "boats", "boats made up its first fleet"),
    ("music school", "founded", "pianos", "pianos were bought for its practice rooms"),
    ("clock tower", "built", "bells", "bells hang in its belfry"),
]

FILLER = [
    "Most mornings in {town} begin at the market square, where farmers from the surrounding hills set up their "
    "stalls before the sun is fully up. They sell apples, onions, cheese wrapped in cloth and bread that is still "
    "warm. By nine o'clock the square is crowded with shoppers, children on their way to school and dogs that "
    "wander between the tables hoping for scraps. The market closes at noon, and the square is swept clean "
    "before the cafés put their chairs back out for lunch.",
    "The {river} river runs along the eastern edge of {town}. In spring it rises with melted snow from the "
    "mountains and sometimes floods the low meadows, which is why the older houses stand on raised stone "
    "foundations. In summer the water is slow and shallow, and families come down to the banks on warm evenings "
    "to fish, to paddle or simply to sit and watch the swallows skim the surface.",
    "The weather in {town} is mild for most of the year. Winters are damp rather than cold, and it rarely snows "
    "for more than a few days at a time. Autumn is the wettest season, with long grey weeks of drizzle that the "
    "locals complain about cheerfully. Summers are warm but seldom hot, and a breeze usually comes in off the "
    "water in the late afternoon.",
    "Children in {town} attend the primary school on Church Lane until they are eleven, and then take the bus to "
    "the secondary school in the next valley. The school day starts at half past eight. Parents take turns "
    "walking groups of younger children to school, and in bad weather a neighbour with a large car often drives "
    "whoever is waiting at the corner.",
    "Every September the town holds a harvest fair on the common. There are competitions for the largest "
    "pumpkin, the best jam and the most handsome sheep, and a brass band plays in the afternoon. The fair ends "
    "with a long supper at tables set out in rows on the grass, where everyone brings a dish to share and the "
    "speeches go on for rather longer than anyone would like.",
    "The road into {town} winds down from the hills through woods of oak and beech. Cyclists like it for its "
    "gentle slopes, but lorry drivers dislike the tight bends near the old quarry. A bus runs to the city four "
    "times a day, and the journey takes a little over an hour if the driver does not stop to chat at every "
    "village along the way.",
    "Many families in {town} keep small gardens behind their houses, where they grow beans, potatoes, lettuces "
    "and herbs. Gardening advice is traded freely over the fences, and there is a friendly rivalry about whose "
    "tomatoes ripen first. In late summer, baskets of surplus courgettes appear on doorsteps with notes inviting "
    "passers-by to help themselves.",
    "The town hall stands on the north side of the square. Its council meets on the first Tuesday of each month, "
    "and the meetings are open to anyone who wishes to attend. Most evenings the discussion is about parking, "
    "potholes and the opening hours of the public toilets, though a proposal to move the bus stop once kept the "
    "council talking until well after midnight.",
    "On Saturday afternoons the football pitch behind the school is busy with matches between local teams. The "
    "players are mostly farmers, shopkeepers and teachers, and the games are played with more enthusiasm than "
    "skill. Afterwards both teams usually go to the same pub, where the result is argued about until closing time.",
    "The woods to the south of {town} are full of walking paths. In April the ground is covered with bluebells, "
    "and in October people come to gather mushrooms and chestnuts. A retired forester leads guided walks on "
    "Sunday mornings, pointing out the tracks of deer and badgers and telling stories about the storms that "
    "brought down the tallest trees.",
    "The small railway station closed many years ago, but the building still stands at the end of Station Road. "
    "It is now a café with tables on the old platform, where walkers stop for tea and cake. On the walls hang "
    "photographs of steam trains and of the station staff in their uniforms, and the old ticket window is used to "
    "serve ice cream in summer.",
    "The doctor's surgery in {town} is open every weekday morning, and a nurse visits elderly patients at home in "
    "the afternoons. For anything serious, people must travel to the hospital in the city. The pharmacy next door "
    "to the surgery is run by a family who have lived in the town for as long as anyone can remember.",
    "In the evenings the pub on the corner of the square is the busiest place in {town}. It serves simple food: "
    "pies, soups, fish on Fridays and a roast on Sundays. On Thursday nights there is a quiz, and the same three "
    "teams have been competing for the prize, a bottle of wine and a good deal of boasting, for several years.",
    "Winter evenings in {town} are quiet. Most people stay indoors, and the streets are empty apart from the odd "
    "dog walker. The library holds reading evenings once a week, the choir practises in the church hall on "
    "Wednesdays, and there is a film club that shows an old film on the last Friday of every month.",
]

QUESTIONS = {
    "person": "According to the passage, who {verb} the {what} in {town}? Answer in one short sentence.",
    "year": "According to the passage, in which year was the {what} in {town} {verb}? Answer in one short sentence.",
    "count": "According to the passage, how many {count} does the {what} in {town} have? Answer in one short "
             "sentence.",
    "colour": "According to the passage, what colour is the door of the {what} in {town}? Answer in one short "
              "sentence.",
}


def case(i: int, paragraphs: int, *, question_first: bool = True) -> dict:
    rng = random.Random(1000 + i)
    town, person = TOWNS[i % len(TOWNS)], PEOPLE[(i * 7) % len(PEOPLE)]
    what, verb, count, unit = THINGS[i % len(THINGS)]
    river = RIVERS[i % len(RIVERS)]
    year, number, colour = rng.randint(1782, 1938), rng.randint(3, 97), rng.choice(COLOURS)
    facts = (f"The {what} in {town} was {verb} in {year} by {person}, who had moved to the town from the coast as "
             f"a young engineer. {number} {unit}. Its front door has always been painted {colour}, and the people "
             f"of {town} still repaint it every spring. {person} lived next to the {what} until the end of a long "
             "life and is buried in the churchyard on the hill.")
    body = rng.sample(FILLER, paragraphs)
    passage = "\n\n".join([facts, *(p.format(town=town, river=river) for p in body)])
    kind = list(QUESTIONS)[i % len(QUESTIONS)]
    expected = {"person": person.split()[-1], "year": str(year), "count": str(number), "colour": colour}[kind]
    question = QUESTIONS[kind].format(what=what, verb=verb, town=town, count=count)
    # Question first: the answer's wording then hangs on a question ~500 tokens back, not only its fact on a
    # paragraph as far. Asked after the passage, the model copies its wording from the adjacent question and
    # Qwen2.5's rope base ÷ 100 changed the first four tokens of only 2 of 16 answers (question first: 6 of 11).
    if question_first:
        content = f"Read the passage below, then answer this question about it: {question}\n\n{passage}"
    else:
        content = f"Read the passage and answer the question.\n\n{passage}\n\nQuestion: {question}"
    return {"id": f"long-{i + 1:02d}-{kind}", "slice": "long-context",
            "messages": [{"role": "user", "content": content}], "expected": expected, "match": "contains"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--paragraphs", type=int, default=5, help="everyday paragraphs after the facts")
    ap.add_argument("--question-last", action="store_true",
                    help="ask after the passage instead (measured: too easy to tell a rope breakage)")
    args = ap.parse_args()
    for i in range(args.count):
        c = case(i, args.paragraphs, question_first=not args.question_last)
        sys.stdout.write(json.dumps(c, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
