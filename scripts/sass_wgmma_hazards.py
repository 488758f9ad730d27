#!/usr/bin/env python3
"""Scans SASS (cuobjdump -sass output) for writes to the A registers of an
in-flight register-A wgmma (HGMMA R_d, R_a, gdesc...) before the
WARPGROUP.DEPBAR.LE gsb0, 0x0 that retires it. ptxas does not guard those
registers (docs/design-notes.md: a version of attention_wg_k that packed the
next P during P·V got the same registers and failed the op harness), so a
kernel whose source reorders P packing should be scanned before it runs.

usage: scripts/sass_wgmma_hazards.py FILE.sass ...   (exit status 1 on a hazard)
Get SASS with the nvidia-cuda-cuobjdump wheel's cuobjdump:
  cuobjdump -sass -fun MANGLED_NAME build/cuda/src/backend/cuda/attn_prompt_wgmma.o > k.sass
"""
import re
import sys

HGMMA_RA = re.compile(r'(@!?U?P\w+\s+)?HGMMA\.\S+\s+R\d+,\s+R(\d+),')
WAIT = re.compile(r'WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d)')
DEST = re.compile(r'(@!?P\w+\s+)?([A-Z0-9_.]+)\s+(R\d+)')
NO_DEST = ('ST', 'RED', 'ATOM', 'BRA', 'HGMMA', 'WARPGROUP')


def scan(path):
    """Returns the (line number, instruction) pairs that write a live A register."""
    live, hits = [], []
    for n, line in enumerate(open(path), 1):
        if '*/' not in line:
            continue
        ins = line.split('*/', 1)[1].strip().rstrip(';').strip()
        m = HGMMA_RA.match(ins)
        if m:  # its four A registers stay read until the wait that retires it
            base = int(m.group(2))
            live.append({f'R{base + k}' for k in range(4)})
            continue
        m = WAIT.match(ins)
        if m:
            if m.group(1) == '0':
                live = []
            continue
        m = DEST.match(ins)
        if not m or not live or m.group(2).startswith(NO_DEST):
            continue
        regs = {m.group(3)}
        if '.64' in m.group(2) or m.group(2).startswith(('CS2R', 'IMAD.WIDE')):
            regs.add(f'R{int(m.group(3)[1:]) + 1}')
        if any(regs & s for s in live):
            hits.append((n, ins))
    return hits


def main():
    bad = 0
    for path in sys.argv[1:]:
        hits = scan(path)
        for n, ins in hits:
            print(f'{path}:{n}: writes an in-flight wgmma A register: {ins}')
        print(f'{path}: {len(hits)} hazard(s)')
        bad += len(hits)
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
