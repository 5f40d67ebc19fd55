"""Write the synthetic sample catalog and interaction log (items.csv, interactions.csv).

Everything here is invented by us: item texts are composed from small per-category word
lists, users follow 1-3 favourite categories and sub-topics with occasional drift, and
popularity inside a sub-topic is Zipf-like, so some items are rare, and about 12% of the
catalog are "new arrivals" that only appear as users' last events: cold test targets whose
text (category, sub-topic words) is the only thing that tells what they are. Deterministic: same seed -> the same bytes.

    python sample_data/generate.py            # rewrites sample_data/items.csv and interactions.csv
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

SEED = 20240517
N_ITEMS = 1000
N_USERS = 800
MIN_LEN, MAX_LEN = 8, 40
ZIPF_S = 0.85  # popularity exponent inside a sub-topic
NEW_ARRIVALS = 0.12  # share of items launched at the end of the log: they appear only as users' last events
NEW_ARRIVAL_P = 0.2  # chance that one of a user's last two events is a new arrival of a liked sub-topic
START = 1_672_531_200  # 2023-01-01T00:00:00Z

# category -> brands, adjectives, uses, {sub-topic: (product nouns, features)}, title pattern, description patterns
CATALOG = {
    "sci-fi novels": dict(
        brands=["Nebula House", "Orbit Lane Press", "Farstar Books", "Quasar Editions", "Deepfield Publishing"],
        adjectives=[
            "Silent",
            "Burning",
            "Last",
            "Hollow",
            "Crimson",
            "Infinite",
            "Broken",
            "Distant",
            "Frozen",
            "Iron",
        ],
        uses=["readers who like big ideas", "long flights", "fans of hard science fiction", "book clubs"],
        subtopics={
            "space opera": (
                ["Armada", "Empire", "Starfleet", "Throne", "Nebula"],
                ["galactic wars", "rival dynasties", "warship crews"],
            ),
            "cyberpunk": (
                ["Circuit", "Neon City", "Datastream", "Chrome", "Protocol"],
                ["rogue AIs", "megacorporations", "hackers"],
            ),
            "first contact": (
                ["Signal", "Visitors", "Beacon", "Message", "Threshold"],
                ["alien languages", "deep-space probes", "linguists"],
            ),
            "time travel": (
                ["Paradox", "Loop", "Yesterday", "Clockwork", "Echo"],
                ["branching timelines", "lost centuries", "temporal agents"],
            ),
        },
        title="The {adj} {noun}",
        desc=["A {sub} novel about {f1} and {f2}.", "{Adj} {sub} story of {f1}; perfect for {use}."],
    ),
    "mystery novels": dict(
        brands=["Blackquill Press", "Marlow & Finch", "Lantern Street Books", "Greyhaven Crime"],
        adjectives=[
            "Quiet",
            "Drowned",
            "Missing",
            "Seventh",
            "Poisoned",
            "Midnight",
            "Gilded",
            "Locked",
            "Cold",
            "Winter",
        ],
        uses=["a rainy weekend", "fans of classic whodunits", "readers who love twists", "the beach"],
        subtopics={
            "detective story": (
                ["Inspector", "Alibi", "Case", "Witness", "Ledger"],
                ["a weary inspector", "a locked-room puzzle", "forensic clues"],
            ),
            "cozy mystery": (
                ["Bakery", "Garden Party", "Teashop", "Village Fete", "Knitting Circle"],
                ["a nosy baker", "a small village", "cats and gossip"],
            ),
            "noir thriller": (
                ["Harbor", "Gunsmoke", "Rain", "Nightclub", "Ashes"],
                ["a crooked city", "a femme fatale", "smoky bars"],
            ),
            "psychological thriller": (
                ["Guest", "Stranger", "Sister", "Lie", "Mirror"],
                ["an unreliable narrator", "buried secrets", "a tense marriage"],
            ),
        },
        title="The {adj} {noun}",
        desc=["A {sub} with {f1} and {f2}.", "{Adj} {sub} featuring {f1}; made for {use}."],
    ),
    "cookware": dict(
        brands=["Hearthmark", "Copperline", "Brava Kitchen", "Ironleaf", "Saltpan"],
        adjectives=[
            "Pre-seasoned",
            "Tri-ply",
            "Heavy-gauge",
            "Enamelled",
            "Professional",
            "Compact",
            "Classic",
            "Induction-ready",
        ],
        uses=["weeknight dinners", "searing steaks", "slow braises", "home bakers"],
        subtopics={
            "cast iron": (
                ["Skillet", "Dutch Oven", "Griddle", "Grill Pan"],
                ["even heat retention", "a pour spout", "oven-safe handles"],
            ),
            "nonstick": (
                ["Frying Pan", "Saute Pan", "Omelette Pan", "Wok"],
                ["a PFOA-free ceramic coating", "easy-release surface", "a stay-cool handle"],
            ),
            "bakeware": (
                ["Loaf Tin", "Sheet Pan", "Springform Pan", "Muffin Tray"],
                ["a non-warp steel core", "rolled edges", "quick release"],
            ),
            "cutlery": (
                ["Chef Knife", "Santoku", "Paring Knife", "Bread Knife"],
                ["a high-carbon steel blade", "a full tang", "a pakkawood handle"],
            ),
        },
        title="{brand} {adj} {noun} {size}",
        desc=["{Adj} {noun_l} with {f1} and {f2}.", "Part of the {sub} range, ideal for {use}."],
    ),
    "trail running gear": dict(
        brands=["Ridgeline", "Kestrel Trail", "Switchback", "Scree Co.", "Fellrunner"],
        adjectives=["Lightweight", "Waterproof", "Breathable", "Ultralight", "Grippy", "Cushioned", "Reflective"],
        uses=["technical mountain trails", "ultramarathons", "muddy fell races", "early-morning runs"],
        subtopics={
            "shoes": (
                ["Trail Shoe", "Fell Shoe", "Mountain Runner", "Racing Flat"],
                ["a rock plate", "5 mm lugs", "a wide toe box"],
            ),
            "hydration": (
                ["Running Vest", "Hydration Pack", "Soft Flask", "Waist Belt"],
                ["two soft flasks", "bounce-free fit", "pole loops"],
            ),
            "headlamps": (
                ["Headlamp", "Chest Light", "Trail Beam", "Night Lamp"],
                ["a 600-lumen beam", "USB-C charging", "a red night mode"],
            ),
            "apparel": (
                ["Shell Jacket", "Trail Shorts", "Merino Tee", "Running Tights"],
                ["taped seams", "a stash pocket", "flatlock stitching"],
            ),
        },
        title="{brand} {adj} {noun} {model}",
        desc=["{Adj} {noun_l} built for {use}, with {f1}.", "Part of the {sub} range, with {f3}."],
    ),
    "board games": dict(
        brands=["Meeple Forge", "Dicetower Games", "Cardboard Crown", "Hexfield", "Tabletop Tides"],
        adjectives=["Epic", "Quick", "Cunning", "Lost", "Golden", "Tiny", "Grand", "Secret"],
        uses=["game nights", "two players", "families with kids", "large groups"],
        subtopics={
            "strategy": (
                ["Empires", "Railways", "Colonies", "Dynasties"],
                ["engine building", "area control", "resource trading"],
            ),
            "party": (
                ["Charades", "Bluff", "Wordplay", "Sketch Off"],
                ["fast rounds", "team guessing", "hidden roles"],
            ),
            "cooperative": (
                ["Expedition", "Outbreak", "Rescue", "Fortress"],
                ["shared victory", "a rising threat", "scenario campaigns"],
            ),
            "family": (
                ["Farmyard", "Treasure Hunt", "Lighthouse", "Dragon Eggs"],
                ["simple rules", "colourful tiles", "20-minute play"],
            ),
        },
        title="{adj} {noun}",
        desc=["A {sub} board game about {f1} and {f2}.", "{Adj} {sub} game for {use}, with {f3}."],
    ),
    "coffee and tea": dict(
        brands=["Roastwell", "Leaf & Kettle", "Crema Lab", "Highland Estate", "Morning Ritual"],
        adjectives=["Single-origin", "Organic", "Dark roast", "Smooth", "Small-batch", "Bold", "Fragrant"],
        uses=["slow mornings", "coffee and tea lovers", "afternoon breaks", "gifting"],
        subtopics={
            "espresso": (
                ["Espresso Blend", "Crema Beans", "Ristretto Roast", "Moka Blend"],
                ["chocolate notes", "a thick crema", "low acidity"],
            ),
            "pour-over": (
                ["Dripper", "Gooseneck Kettle", "Filter Papers", "Carafe"],
                ["precise flow control", "a spiral rib design", "borosilicate glass"],
            ),
            "loose-leaf tea": (
                ["Green Tea", "Oolong", "Earl Grey", "Chai Blend"],
                ["whole leaves", "hand-picked buds", "bergamot oil"],
            ),
            "grinders": (
                ["Burr Grinder", "Hand Grinder", "Blade Mill", "Conical Grinder"],
                ["stepless adjustment", "stainless burrs", "low retention"],
            ),
        },
        title="{brand} {adj} {noun}",
        desc=["{Adj} {noun_l} with {f1} and {f2}.", "Part of the {sub} range, with {f3}."],
    ),
    "gardening": dict(
        brands=["Greenthumb", "Rootstock", "Bloomfield", "Mossy Gate", "Allotment Co."],
        adjectives=["Heirloom", "Rust-proof", "Self-watering", "Ergonomic", "Frost-hardy", "Compact", "Heavy-duty"],
        uses=["balcony gardens", "raised beds", "first-time growers", "allotments"],
        subtopics={
            "seeds": (
                ["Tomato Seeds", "Herb Seed Kit", "Wildflower Mix", "Chilli Seeds"],
                ["high germination", "open pollination", "pollinator-friendly blooms"],
            ),
            "tools": (
                ["Pruning Shears", "Hand Trowel", "Garden Fork", "Hori Hori Knife"],
                ["a carbon-steel blade", "a cushioned grip", "a lifetime warranty"],
            ),
            "planters": (
                ["Planter Box", "Grow Bag", "Window Box", "Hanging Basket"],
                ["drainage holes", "UV-stable plastic", "a water reservoir"],
            ),
            "irrigation": (
                ["Drip Kit", "Soaker Hose", "Water Timer", "Rain Barrel"],
                ["adjustable emitters", "a brass connector", "a 24-hour schedule"],
            ),
        },
        title="{brand} {adj} {noun}",
        desc=["{Adj} {noun_l} for {use}, with {f1}.", "Part of the {sub} range, with {f3}."],
    ),
    "camping": dict(
        brands=["Basecamp", "Pinecone Outfitters", "Northwind", "Emberlight", "Trailhead"],
        adjectives=["Lightweight", "Four-season", "Packable", "Rugged", "Compact", "Insulated"],
        uses=["backpacking trips", "family campsites", "winter camping", "festival weekends"],
        subtopics={
            "tents": (
                ["Dome Tent", "Tunnel Tent", "Bivy Shelter", "Tarp"],
                ["a freestanding frame", "a full-coverage fly", "two vestibules"],
            ),
            "sleeping": (
                ["Sleeping Bag", "Sleeping Pad", "Camp Pillow", "Quilt"],
                ["down insulation", "a -5 C comfort rating", "a compression sack"],
            ),
            "stoves": (
                ["Camp Stove", "Gas Burner", "Cook Set", "Windscreen"],
                ["a piezo igniter", "simmer control", "nesting pots"],
            ),
            "lanterns": (
                ["Camp Lantern", "String Lights", "Solar Lamp", "Tent Light"],
                ["three brightness levels", "a solar panel", "a hanging hook"],
            ),
        },
        title="{brand} {adj} {noun} {model}",
        desc=["{Adj} {noun_l} for {use}, with {f1} and {f2}.", "Part of the {sub} range, with {f3}."],
    ),
    "yoga and fitness": dict(
        brands=["Flowform", "Corebalance", "Lotus Lab", "Ironpulse", "Stretchwell"],
        adjectives=["Non-slip", "Eco-friendly", "Extra-thick", "Adjustable", "Portable", "Premium"],
        uses=["home workouts", "hot yoga", "physical therapy", "strength training"],
        subtopics={
            "mats": (
                ["Yoga Mat", "Travel Mat", "Pilates Mat", "Mat Towel"],
                ["natural rubber", "alignment lines", "a carry strap"],
            ),
            "bands": (
                ["Resistance Bands", "Loop Bands", "Pull-up Band", "Tube Set"],
                ["five resistance levels", "latex-free fabric", "door anchors"],
            ),
            "weights": (
                ["Dumbbell Set", "Kettlebell", "Weight Plate", "Wrist Weights"],
                ["a knurled grip", "quick-change dials", "a neoprene coating"],
            ),
            "recovery": (
                ["Foam Roller", "Massage Ball", "Massage Gun", "Stretch Strap"],
                ["a textured surface", "deep-tissue pressure", "a travel case"],
            ),
        },
        title="{brand} {adj} {noun}",
        desc=["{Adj} {noun_l} for {use}, with {f1}.", "Part of the {sub} range, with {f3}."],
    ),
    "audio": dict(
        brands=["Sonance", "Bassline", "Clearwave", "Studio North", "Echovale"],
        adjectives=["Wireless", "Noise-cancelling", "Hi-fi", "Portable", "Studio-grade", "Retro"],
        uses=["commuting", "home listening", "small studios", "everyday use"],
        subtopics={
            "headphones": (
                ["Headphones", "Earbuds", "Monitor Headphones", "Sport Earphones"],
                ["40-hour battery life", "active noise cancelling", "memory-foam cushions"],
            ),
            "speakers": (
                ["Bookshelf Speakers", "Bluetooth Speaker", "Soundbar", "Subwoofer"],
                ["a silk-dome tweeter", "IPX7 waterproofing", "room correction"],
            ),
            "turntables": (
                ["Turntable", "Phono Preamp", "Cartridge", "Record Cleaner"],
                ["a belt drive", "an aluminium platter", "a moving-magnet stylus"],
            ),
            "microphones": (
                ["Condenser Mic", "USB Microphone", "Dynamic Mic", "Boom Arm"],
                ["a cardioid pattern", "zero-latency monitoring", "a shock mount"],
            ),
        },
        title="{brand} {adj} {noun} {model}",
        desc=["{Adj} {noun_l} with {f1} and {f2}.", "Part of the {sub} range, with {f3}."],
    ),
    "art supplies": dict(
        brands=["Atelier Nine", "Brushwork", "Pigment House", "Inkwell & Co.", "Canvasa"],
        adjectives=["Artist-grade", "Student", "Vibrant", "Archival", "Travel", "Professional"],
        uses=["plein air painters", "beginners", "illustrators", "journal keepers"],
        subtopics={
            "watercolor": (
                ["Watercolor Set", "Watercolor Paper", "Mop Brush", "Paint Palette"],
                ["granulating pigments", "cold-pressed cotton", "a water brush"],
            ),
            "sketching": (
                ["Sketchbook", "Graphite Pencils", "Charcoal Set", "Kneaded Eraser"],
                ["acid-free pages", "grades 6H to 8B", "a lay-flat binding"],
            ),
            "acrylic": (
                ["Acrylic Paint Set", "Canvas Panels", "Palette Knives", "Gel Medium"],
                ["heavy body paint", "lightfast colours", "a satin finish"],
            ),
            "calligraphy": (
                ["Calligraphy Pen Set", "Ink Bottle", "Brush Pens", "Practice Pad"],
                ["flexible nibs", "waterproof ink", "guideline sheets"],
            ),
        },
        title="{brand} {adj} {noun}",
        desc=["{Adj} {noun_l} with {f1}, loved by {use}.", "Part of the {sub} range, with {f3}."],
    ),
    "pet supplies": dict(
        brands=["Pawsome", "Whisker Works", "Tailwind Pets", "Fin & Feather", "Good Boy Co."],
        adjectives=["Chew-proof", "Washable", "Interactive", "Cozy", "Durable", "Quiet"],
        uses=["happy pets", "busy owners", "small homes", "first-time pet parents"],
        subtopics={
            "dog toys": (
                ["Rope Toy", "Squeaky Ball", "Puzzle Feeder", "Tug Ring"],
                ["natural rubber", "a hidden treat pocket", "a floating design"],
            ),
            "cat furniture": (
                ["Cat Tree", "Scratching Post", "Window Perch", "Cat Cave"],
                ["sisal rope", "a plush hammock", "suction-cup mounts"],
            ),
            "aquarium": (
                ["Aquarium Filter", "Tank Heater", "LED Light", "Air Pump"],
                ["three-stage filtration", "an adjustable thermostat", "a planted-tank spectrum"],
            ),
            "bird feeders": (
                ["Seed Feeder", "Suet Cage", "Bird Bath", "Nesting Box"],
                ["a squirrel guard", "weatherproof cedar", "easy-fill lids"],
            ),
        },
        title="{brand} {adj} {noun}",
        desc=["{Adj} {noun_l} for {use}, with {f1}.", "Part of the {sub} range, with {f3}."],
    ),
}
SIZES = ["20 cm", "24 cm", "26 cm", "28 cm", "30 cm", "4.5 L", "5.5 L"]


def _lower(text: str) -> str:
    """Lower-case a product noun for mid-sentence use, keeping acronyms (LED, USB)."""
    return " ".join(w if w.isupper() and len(w) > 1 else w.lower() for w in text.split())


def make_items(rng: random.Random) -> list[dict]:
    """~N_ITEMS items spread unevenly over the categories, each tied to one sub-topic."""
    names = list(CATALOG)
    weights = [rng.uniform(0.6, 1.4) for _ in names]
    sizes = [int(N_ITEMS * w / sum(weights)) for w in weights]
    sizes[0] += N_ITEMS - sum(sizes)
    items, titles = [], set()
    for name, size in zip(names, sizes, strict=True):
        spec = CATALOG[name]
        subs = list(spec["subtopics"])
        for k in range(size):
            sub = subs[k % len(subs)]
            nouns, features = spec["subtopics"][sub]
            for attempt in range(50):
                noun, adj = rng.choice(nouns), rng.choice(spec["adjectives"])
                f1, f2, f3 = rng.sample(features, 3)
                words = dict(
                    brand=rng.choice(spec["brands"]),
                    adj=adj,
                    Adj=adj,
                    noun=noun,
                    noun_l=_lower(noun),
                    sub=sub,
                    f1=f1,
                    f2=f2,
                    f3=f3,
                    use=rng.choice(spec["uses"]),
                    size=rng.choice(SIZES),
                    model=f"{rng.choice('ABCDEFGHKMRSTX')}{rng.randint(1, 9)}",
                )
                title = spec["title"].format(**words)
                if attempt >= 10:
                    title += f" {rng.choice(['II', 'III', 'Deluxe', 'Mini', 'Plus', 'Edition 2', 'Pro', 'Lite'])}"
                if title not in titles:
                    break
            titles.add(title)
            sentences = [s.format(**words) for s in spec["desc"]]
            description = " ".join(sentences[: 1 + (rng.random() < 0.6)])
            items.append(
                dict(
                    title=title,
                    description=description[0].upper() + description[1:],
                    category=name,
                    brand=words["brand"],
                    _sub=sub,
                )
            )
    rng.shuffle(items)
    for i, item in enumerate(items, start=1):
        item["item_id"] = f"i{i:04d}"
    return items


def make_interactions(rng: random.Random, items: list[dict]) -> list[dict]:
    """Users with 1-3 favourite categories (and sub-topics) that drift; Zipf-like popularity per sub-topic."""
    pools: dict[tuple[str, str], list[str]] = {}
    for item in items:
        pools.setdefault((item["category"], item["_sub"]), []).append(item["item_id"])
    # New arrivals never show up in the bulk of the log, so as test targets they are cold items
    # whose only link to the rest of the catalog is their text (category and sub-topic words).
    arrivals: dict[tuple[str, str], list[str]] = {}
    for key, ids in pools.items():
        n_new = int(len(ids) * NEW_ARRIVALS)
        arrivals[key], pools[key] = ids[len(ids) - n_new :], ids[: len(ids) - n_new]
    weighted = {}
    for key, ids in pools.items():  # random popularity rank inside the sub-topic
        order = rng.sample(ids, len(ids))
        weighted[key] = (order, [1.0 / (rank + 1) ** ZIPF_S for rank in range(len(order))])
    categories = list(CATALOG)
    rows = []
    for u in range(1, N_USERS + 1):
        favourites = rng.sample(categories, rng.choice([1, 1, 2, 2, 2, 3]))
        liked_subs = {c: rng.sample(list(CATALOG[c]["subtopics"]), rng.choice([1, 2])) for c in categories}
        length = MIN_LEN + int((MAX_LEN - MIN_LEN + 1) * rng.random() ** 1.6)  # MIN_LEN..MAX_LEN
        t = START + rng.randint(0, 180 * 86400)
        seen: set[str] = set()
        previous = None
        for position in range(length):
            if rng.random() < 0.05:  # drift: one favourite is replaced
                favourites[rng.randrange(len(favourites))] = rng.choice(categories)
            if previous is not None and rng.random() < 0.015:
                item_id = previous  # a repeated click, removed by --dedupe
            else:
                category = rng.choice(categories) if rng.random() < 0.1 else rng.choice(favourites)
                subs = list(CATALOG[category]["subtopics"])
                sub = rng.choice(liked_subs[category]) if rng.random() < 0.75 else rng.choice(subs)
                order, weights = weighted[(category, sub)]
                fresh = arrivals[(category, sub)]
                if position >= length - 2 and fresh and rng.random() < NEW_ARRIVAL_P:
                    item_id = rng.choice(fresh)
                else:
                    for _ in range(5):  # mostly new items for this user
                        item_id = rng.choices(order, weights)[0]
                        if item_id not in seen:
                            break
            t += 600 + int(rng.expovariate(1 / (2 * 86400)))
            rating = rng.choices([5, 4, 3, 2, 1], [40, 35, 15, 6, 4])[0]
            rows.append(dict(user_id=f"u{u:04d}", item_id=item_id, timestamp=t, rating=rating))
            seen.add(item_id)
            previous = item_id
    rows.sort(key=lambda r: (r["timestamp"], r["user_id"]))
    return rows


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(out_dir: Path = Path(__file__).resolve().parent) -> None:
    rng = random.Random(SEED)
    items = make_items(rng)
    rows = make_interactions(rng, items)
    write_csv(out_dir / "items.csv", items, ["item_id", "title", "description", "category", "brand"])
    write_csv(out_dir / "interactions.csv", rows, ["user_id", "item_id", "timestamp", "rating"])


if __name__ == "__main__":
    main()
