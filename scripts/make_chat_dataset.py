"""Write the multi-turn support-chat dataset the prefix-caching example studies measure
(search_spaces/data/support-chat.jsonl, openai-chat format).

Why this shape: a deployed assistant resends its long system prompt and the conversation so
far on every turn, so most of each prompt repeats tokens the server has seen. That is the
traffic prefix caching and chunked prefill are for, and the tuner's synthetic prompts (which
share almost nothing) cannot show it. Here four products each have a system prompt of about
500 tokens; each conversation is one customer's three questions to one product's assistant.
The dataset's assistant messages are placeholders: the tuner sends the server's own replies
back on later turns (docs/measurement.md, "Your own traffic").

    python3 scripts/make_chat_dataset.py            # rewrites the committed file
    python3 scripts/make_chat_dataset.py --check    # exit 1 when the committed file differs

Deterministic (a seeded random.Random): the committed file is this script's output, and a
test holds them equal.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "search_spaces" / "data" / "support-chat.jsonl"
CONVERSATIONS = 48
TURNS = 3

PRODUCTS = {
    "Lumen router": ("a home Wi-Fi router", ["mesh pairing", "guest networks", "firmware updates",
                                             "port forwarding", "parental schedules", "band steering"]),
    "Quill notes": ("a note-taking app", ["sync conflicts", "shared notebooks", "offline mode",
                                          "export to PDF", "tag search", "handwriting import"]),
    "Harbor bank": ("a mobile banking app", ["card freezes", "transfer limits", "statements",
                                             "two-factor codes", "direct deposit", "travel notices"]),
    "Tern bikes": ("an electric bicycle", ["battery range", "brake pads", "motor assist levels",
                                           "charging times", "frame sizes", "warranty claims"]),
}

RULES = [
    "Greet the customer once, in the first reply only, and never repeat the greeting.",
    "Answer in at most three short sentences unless the customer asks for step-by-step help.",
    "Never ask for a full password, a full card number or a one-time code.",
    "When a question is outside {product}, say so plainly and point to the general help page.",
    "If the customer is upset, acknowledge it in one sentence before the answer.",
    "Quote settings by the exact menu path, for example Settings > Account > Security.",
    "Do not promise refunds, replacements or delivery dates; offer to open a ticket instead.",
    "Prefer the steps that work on the current release; mention older releases only if asked.",
    "When two answers are possible, ask one clarifying question rather than guessing.",
    "Keep a friendly, plain tone: no jargon without a one-line explanation.",
    "Offer a human agent when the customer asks twice for the same thing.",
    "Never share internal ticket notes, staff names or system identifiers.",
]

FACTS = [
    "The current release of {product} is 4.{n}, published this quarter.",
    "Support hours are 7:00 to 22:00 local time, every day except public holidays.",
    "Topic '{topic}': the help page is help.example.com/{slug}; it has a short video.",
    "Topic '{topic}': most problems are solved by restarting {product} and waiting two minutes.",
    "Topic '{topic}': customers on release 3.x must update first; the fix is not in 3.x.",
    "Topic '{topic}': the setting lives under Settings > {section}.",
    "A ticket is opened from the Help tab; the customer receives a reference by e-mail.",
    "The status page status.example.com lists outages; check it before troubleshooting.",
]

QUESTIONS = [
    "How do I set up {topic} on my {product}?",
    "My {topic} stopped working after the last update. What should I try first?",
    "Is there a limit on {topic}, and can I change it?",
    "Where exactly is the setting for {topic}?",
    "Can you explain {topic} in simple terms?",
    "What happens to {topic} if I reset the {product}?",
]
FOLLOW_UPS = [
    "I tried that and it did not help. What next?",
    "Thanks. Does the same apply to {topic2}?",
    "Can you give me the exact steps, one per line?",
    "Would a ticket be faster? What information will you need from me?",
    "Is this different on the older release?",
    "Okay, and how long does it usually take to take effect?",
]


def system_prompt(product: str, what: str, topics: list[str], rng: random.Random) -> str:
    lines = [f"You are the customer support assistant for {product}, {what}. Follow these rules."]
    lines += [f"{i + 1}. {rule.format(product=product)}" for i, rule in enumerate(RULES)]
    lines.append(f"Reference facts about {product}:")
    for topic in topics:
        slug = topic.replace(" ", "-")
        section = rng.choice(["Network", "Account", "Devices", "Advanced", "General", "Privacy"])
        for fact in FACTS:
            if "{topic}" in fact:
                lines.append("- " + fact.format(product=product, topic=topic, slug=slug, section=section))
    lines += ["- " + f.format(product=product, n=rng.randint(2, 9)) for f in FACTS if "{topic}" not in f]
    return "\n".join(lines)


def conversations() -> list[dict[str, object]]:
    rng = random.Random(20261206)
    systems = {name: system_prompt(name, what, topics, rng) for name, (what, topics) in PRODUCTS.items()}
    out: list[dict[str, object]] = []
    names = list(PRODUCTS)
    for i in range(CONVERSATIONS):
        product = names[i % len(names)]
        topics = PRODUCTS[product][1]
        topic, topic2 = rng.sample(topics, 2)
        messages = [{"role": "system", "content": systems[product]},
                    {"role": "user", "content": rng.choice(QUESTIONS).format(topic=topic, product=product)}]
        for turn, follow in enumerate(rng.sample(FOLLOW_UPS, TURNS - 1)):
            # The tuner replaces these with the server's own replies when it sends turn k+1.
            messages.append({"role": "assistant", "content": f"(reply {turn + 1})"})
            messages.append({"role": "user", "content": follow.format(topic2=topic2)})
        out.append({"messages": messages})
    return out


def render() -> str:
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in conversations())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT}: {'matches' if same else 'DIFFERS from'} the generator")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}: {CONVERSATIONS} conversations of {TURNS} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
