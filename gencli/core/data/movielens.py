"""Reader of MovieLens folders (ml-100k, ml-1m, ml-latest and RecBole's atomic files)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gencli.core.data.readers import LINE, Problems, RawTable, decode_legacy, parse_delimited, read_bytes

ML100K_GENRES = tuple(
    "unknown|Action|Adventure|Animation|Children's|Comedy|Crime|Documentary|Drama|Fantasy|Film-Noir|Horror|"
    "Musical|Mystery|Romance|Sci-Fi|Thriller|War|Western".split("|")
)
MOVIELENS_LAYOUTS = {  # name -> (interactions file, items file); the folder's files pick the layout
    "ml-100k": ("u.data", "u.item"),
    "ml-1m": ("ratings.dat", "movies.dat"),
    "ml-latest": ("ratings.csv", "movies.csv"),
}


NO_GENRE = {"", "(no genres listed)", "unknown"}  # not a genre: left out of category


def read_movielens(
    folder: Path, interactions: Path | None, problems: Problems
) -> tuple[RawTable | None, RawTable | None, str]:
    """(items, interactions, layout) of a MovieLens folder: 100k, 1M, latest or RecBole atomic files."""
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        problems.add(folder, "the MovieLens folder does not exist", "give the unpacked dataset folder (e.g. ml-1m/)")
        return None, None, ""
    if interactions is not None and interactions.resolve().parent != folder.resolve():
        problems.add(
            interactions,
            "--format movielens reads the ratings from the dataset folder given as items",
            f"leave out the interactions file, or put it in {folder}",
        )
        return None, None, ""
    layout = next((n for n, files in MOVIELENS_LAYOUTS.items() if all((folder / f).is_file() for f in files)), "")
    inter_files = sorted(folder.glob("*.inter"))
    if not layout and inter_files:
        return (*_read_recbole(folder, inter_files, problems), "recbole")
    if not layout:
        expected = "; ".join(f"{n}: {' + '.join(f)}" for n, f in MOVIELENS_LAYOUTS.items())
        problems.add(
            folder,
            f"no MovieLens layout recognised (files: {', '.join(sorted(p.name for p in folder.iterdir()))})",
            f"give a folder with one of {expected}; RecBole: <name>.inter + <name>.item",
        )
        return None, None, ""
    inter_name, items_name = MOVIELENS_LAYOUTS[layout]
    inter_path, items_path = folder / inter_name, folder / items_name
    inter_text, items_text = decode_legacy(read_bytes(inter_path)), decode_legacy(read_bytes(items_path))
    rating_names = ["user_id", "item_id", "rating", "timestamp"]
    if layout == "ml-100k":
        inter = parse_delimited(inter_path, inter_text, problems, "\t", quote=None, names=rating_names)
        genres = _ml100k_genres(folder)
        names = ["item_id", "title", "release_date", "video_release_date", "imdb_url"]
        names += [f"_g{i}" for i in range(len(genres))]
        items = parse_delimited(items_path, items_text, problems, "|", quote=None, names=names)
        if items is not None:
            flags = [
                pl.when(pl.col(f"_g{i}") == "1").then(pl.lit(g)) for i, g in enumerate(genres) if g not in NO_GENRE
            ]
            category = pl.concat_str(flags, separator=", ", ignore_nulls=True).alias("category")
            items = items.select("item_id", "title", category, "release_date", LINE)
    elif layout == "ml-1m":  # '::' separated; one-byte separator for the parser
        inter_text, items_text = inter_text.replace("::", "\x1f"), items_text.replace("::", "\x1f")
        inter = parse_delimited(inter_path, inter_text, problems, "\x1f", quote=None, names=rating_names)
        items = parse_delimited(
            items_path, items_text, problems, "\x1f", quote=None, names=["item_id", "title", "genres"]
        )
    else:
        inter = parse_delimited(inter_path, inter_text, problems, ",")
        items = parse_delimited(items_path, items_text, problems, ",")
        renames = {"userId": "user_id", "movieId": "item_id"}
        inter = inter.rename(renames, strict=False) if inter is not None else None
        items = items.rename(renames, strict=False) if items is not None else None
    if items is not None and "genres" in items.columns:
        items = items.with_columns(_join_genres(pl.col("genres"), "|")).drop("genres")
    return (
        RawTable(items_path, items) if items is not None else None,
        RawTable(inter_path, inter) if inter is not None else None,
        layout,
    )


def _join_genres(expr: pl.Expr, sep: str) -> pl.Expr:
    parts = expr.str.split(sep).list.eval(pl.element().filter(~pl.element().is_in(list(NO_GENRE))))
    return parts.list.join(", ").alias("category")


def _ml100k_genres(folder: Path) -> tuple[str, ...]:
    path = folder / "u.genre"  # 'name|index' lines; the built-in list when absent
    if not path.is_file():
        return ML100K_GENRES
    rows = [line.split("|") for line in decode_legacy(path.read_bytes()).splitlines() if "|" in line]
    return tuple(name for name, _ in sorted(((r[0], int(r[1])) for r in rows), key=lambda r: r[1]))


def _read_recbole(folder: Path, inter_files: list[Path], problems: Problems) -> tuple[RawTable | None, RawTable | None]:
    """RecBole atomic files: tab-separated, header 'name:type'; token_seq fields are space-separated."""
    inter_path = next((p for p in inter_files if p.stem == folder.name), inter_files[0])
    items_path = inter_path.with_suffix(".item")
    if not items_path.is_file():
        problems.add(folder, f"RecBole layout without {items_path.name}", f"add it next to {inter_path.name}")
        return None, None
    tables = []
    for path in (items_path, inter_path):
        frame = parse_delimited(path, decode_legacy(read_bytes(path)), problems, "\t", quote=None)
        if frame is not None:
            frame = frame.rename({c: c.split(":", 1)[0] for c in frame.columns if c != LINE})
        tables.append(RawTable(path, frame) if frame is not None else None)
    items, inter = tables
    if items is not None:
        frame = items.frame
        if "title" not in frame.columns and "movie_title" in frame.columns:
            title = pl.col("movie_title")
            if "release_year" in frame.columns:
                year = pl.col("release_year").str.strip_chars()
                title = pl.when(year != "").then(pl.format("{} ({})", title, year)).otherwise(title)
            frame = frame.with_columns(title.alias("title")).drop("movie_title")
        for source in ("class", "categories", "genre"):
            if source in frame.columns and "category" not in frame.columns:
                words = pl.col(source).str.split(" ").list.eval(pl.element().filter(pl.element() != ""))
                frame = frame.with_columns(words.list.join(", ").alias("category")).drop(source)
        items.frame = frame
    return items, inter
