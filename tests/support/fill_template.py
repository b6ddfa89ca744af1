"""A stand-in for the release's tools/fill_template.py, written from its documented behaviour (facts §10): pairs
split on unescaped "," and key/value on unescaped ":", each key asserted to occur in the file, safe_substitute,
max_queue_size / max_queue_delay_microseconds pre-filled with 0. The real script runs in the gpu tests."""

FILL_STAND_IN = r'''
import sys
from string import Template


def split(text, delim):
    out, cur, esc = [], "", False
    for ch in text:
        if esc:
            cur, esc = cur + ch, False
        elif ch == delim:
            out.append(cur)
            cur = ""
        elif ch == "\\":
            esc = True
        else:
            cur += ch
    out.append(cur)
    return out

args = [a for a in sys.argv[1:] if a not in ("-i", "--in_place")]
path, subs = args
text = open(path).read()
values = {"max_queue_size": 0, "max_queue_delay_microseconds": 0}
for pair in split(subs, ","):
    key, value = split(pair, ":")
    values[key] = value
    assert key in text, f"key '{key}' does not exist in the file {path}."
open(path, "w").write(Template(text).safe_substitute(values))
'''
