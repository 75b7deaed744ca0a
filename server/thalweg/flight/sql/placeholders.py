"""``?`` parameter markers, as JDBC and ADBC users write them, numbered for DataFusion.

DataFusion binds ``$1``, ``$2``, … by position but treats every ``?`` as one parameter
named ``?``. Each bare ``?`` becomes ``$n`` in order of appearance; a ``?`` inside a string
literal, a quoted identifier or a comment is left alone.
"""

from __future__ import annotations


def number_markers(sql: str) -> tuple[str, int]:
    """``sql`` with its ``?`` markers numbered, and how many there were."""
    out: list[str] = []
    count = 0
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":  # a literal or quoted identifier; a doubled quote escapes itself
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            out.append(sql[i : j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out.append(sql[i:j])
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(sql[i:j])
            i = j
        elif c == "?":
            count += 1
            out.append(f"${count}")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out), count
