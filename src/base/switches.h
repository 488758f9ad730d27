/* The environment switches (AUGUR_*): one table of every variable augur
 * reads, with its kind, default, one-line meaning and reader, printed by
 * `augur info --switches` (the README's list is that output). Code reads a
 * switch through these functions, never through getenv, so the table is
 * complete by construction: asking for a name the table lacks is a
 * programming error (logged once, and treated as unset).
 *
 * Values are read from the environment at each call (cheap; the readers
 * keep what they need): a test may set a switch between cases. */
#ifndef AUGUR_BASE_SWITCHES_H
#define AUGUR_BASE_SWITCHES_H

#include <stdbool.h>

typedef enum {
    AG_SWITCH_FLAG, /* on unless the value starts with '0' (or the reverse: see its meaning) */
    AG_SWITCH_INT,
    AG_SWITCH_REAL,
    AG_SWITCH_TEXT,
} ag_switch_kind;

typedef struct {
    const char    *name;    /* AUGUR_... */
    ag_switch_kind kind;
    const char    *deflt;   /* what unset means, in words */
    const char    *meaning; /* one line */
    const char    *reader;  /* the module that reads it */
} ag_switch_info;

/* The table: *n entries, in name order. */
const ag_switch_info *ag_switch_table(int *n);

/* The value of switch `name` (a table entry) from the environment; NULL
 * when unset or empty. */
const char *ag_switch_text(const char *name);

/* Whether switch `name` is set to a value starting with '0' ("turn this
 * off"). */
bool ag_switch_off(const char *name);

/* Switch `name` as an integer (strtol, whole value) within [lo, hi];
 * fallback when unset, malformed or out of range. */
long ag_switch_int(const char *name, long lo, long hi, long fallback);

/* Switch `name` as a number (strtod, whole value) within [lo, hi];
 * fallback when unset, malformed or out of range. */
double ag_switch_real(const char *name, double lo, double hi, double fallback);

#endif
