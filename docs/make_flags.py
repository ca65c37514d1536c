"""Regenerate the per-command tables of docs/FLAGS.md from the click CLI (the text above the
first `## ` heading is kept as written):  python3 docs/make_flags.py"""
from pathlib import Path

import click

from bw24nb.cli import main

path = Path(__file__).with_name("FLAGS.md")
head = path.read_text().split("\n## ", 1)[0].rstrip() + "\n"
parts = [head]
ctx = click.Context(main)
for name in sorted(main.list_commands(ctx)):
    cmd = main.get_command(ctx, name)
    parts.append(f"\n## `bw24nb {name}`\n\n{(cmd.help or '').strip().splitlines()[0]}\n\n"
                 "| option | default | meaning |\n|---|---|---|")
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.hidden:
            continue
        names = " / ".join(p.opts + p.secondary_opts)
        help_text = " ".join((p.help or "").split()).replace("|", "\\|")
        parts.append(f"| `{names}` | `{p.default}` | {help_text} |")
path.write_text("\n".join(parts) + "\n")
print(f"wrote {path}")
