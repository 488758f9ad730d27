#!/usr/bin/env python3
"""Writes tests/unit/tmpl_cases.h: language-feature cases for test_tmpl.c,
each with the output (or error message) Python's jinja2 produces, configured
as transformers configures it (tests/py/jinja_ref.py). Re-run after editing
CASES:  python3 scripts/gen_tmpl_cases.py"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
import jinja_ref  # noqa: E402

CTX = {"msgs": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}],
       "s": "  Hello, World  ", "n": 7, "f": 2.5, "l": [3, 1, 2], "d": {"b": 2, "a": 1, "items": "key"},
       "u": "Ünïcödé ß 日本 😀", "t": True, "none_v": None, "e": "", "nested": {"x": [1, {"y": "z"}]}}

CASES = [
    # ---- whitespace control: trim_blocks + lstrip_blocks
    ("ws_trim_block", "{% if t %}\nyes\n{% endif %}\nafter"),
    ("ws_lstrip_block", "start\n    {% if t %}\n    body\n    {% endif %}\nend"),
    ("ws_var_not_stripped", "a\n    {{ n }}\n  b"),
    ("ws_minus_both", "a   \n  {%- if t -%}  \n  x  \n  {%- endif -%}  \n  b"),
    ("ws_plus_disables_lstrip", "a\n    {%+ if t %}x{% endif %}"),
    ("ws_plus_end_keeps_newline", "{% if t +%}\nx{% endif %}"),
    ("ws_var_minus", "a  {{- n -}}  b"),
    ("ws_comment_trim", "a\n  {# c #}\nb"),
    ("ws_comment_minus", "a  {#- c -#}  b"),
    ("ws_trailing_newline_dropped", "x\n"),
    ("ws_two_trailing_newlines", "x\n\n"),
    ("ws_crlf", "a\r\n{% if t %}\r\nb\r\n{% endif %}\r\nc"),
    ("ws_raw", "{% raw %}{{ not evaluated }}{% endraw %}"),
    ("ws_raw_minus", "a  {%- raw -%}  {{ x }}  {%- endraw -%}  b"),
    ("ws_lstrip_after_text_not", "text {% if t %}x{% endif %}"),
    ("ws_unicode_space_minus", "a\u3000\u00a0{{- n }}"),
    ("ws_lstrip_tab", "a\n\t\t{% if t %}x{% endif %}"),
    ("ws_line_start_after_tag", "{% if t %}\n  {% if t %}y{% endif %}\n{% endif %}"),
    # ---- literals and printing
    ("print_types", "{{ 1 }} {{ 1.0 }} {{ 1.5e20 }} {{ 1e-05 }} {{ true }} {{ None }} {{ 'a' }} {{ [1, 'a', none] }} {{ (1,) }} {{ {'k': [1.0]} }}"),
    ("print_float_repr", "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 2.0 ** 60 }} {{ 1e16 }} {{ 1e15 }} {{ -0.0 }} {{ 100.0 }}"),
    ("string_escapes", r"""{{ 'a\tb\n\x41\u00e9\\ \'q\' ' ~ "d\"q" }}"""),
    ("repr_quotes", """{{ ["it's", 'say "hi"', "both ' \\""] }}"""),
    ("repr_unicode", r"{{ [u, '\u200b', '\x00', '\x7f', '\u00a0', 'tab\there'] }}"),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}"),
    ("integer_literals", "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 007 if false else 1 }}"),
    # ---- operators
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -2 ** 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}"),
    ("concat", "{{ 'a' ~ 1 ~ none ~ [1] }}{{ 'x' + 'y' }}{{ [1] + [2] }}{{ (1,) + (2,) }}"),
    ("compare_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 'a' != 'a' }}"),
    ("in_notin", "{{ 'ell' in 'hello' }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ 5 not in l }}"),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] or 'last' }} {{ not [] }}"),
    ("ternary", "{{ 'y' if t else 'n' }} {{ 'y' if e else 'n' }} [{{ 'y' if e }}]"),
    ("str_repeat", "{{ '-' * 3 }}{{ 2 * 'ab' }}{{ [0] * 2 }}"),
    ("percent_format", "{{ '%s|%5.2f|%-4d|%x|%r' % ('a', 3.14159, 42, 255, 'q') }} {{ '%(a)s' % {'a': 1} }}"),
    # ---- attribute / item access
    ("getattr_getitem", "{{ msgs[1].content }} {{ msgs[1]['role'] }} {{ msgs[-1].role }} {{ nested.x[1].y }} {{ d['items'] }} {{ d.items is callable }}"),
    ("missing_prints_empty", "[{{ msgs[0].nope }}][{{ d['zz'] }}][{{ l[10] }}][{{ undefined_var }}]"),
    ("slices", "{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ u[:4] }} {{ u[::-1] }} {{ 'abcdef'[1:5:2] }} {{ range(10)[2:8:3] }}"),
    ("dict_methods", "{{ d.get('a') }} {{ d.get('q', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}"),
    # ---- control structures
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %},{% endfor %}"),
    ("for_loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}"),
    ("for_prev_next", "{% for x in l %}{{ loop.previtem }}-{{ x }}-{{ loop.nextitem }};{% endfor %}"),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}"),
    ("for_filter", "{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }} {% endfor %}"),
    ("for_unpack", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{% endfor %}"),
    ("for_dict_and_string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'abc' %}{{ c }}.{% endfor %}"),
    ("loop_cycle_changed", "{% for x in [1, 1, 2] %}{{ loop.cycle('a', 'b') }}{{ loop.changed(x) }}{% endfor %}"),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}"),
    # ---- set, namespace, scoping
    ("set_and_block_set", "{% set a = 1 %}{% set b, c = 2, 3 %}{% set blk %}[{{ a }}{{ b }}{{ c }}]{% endset %}{{ blk }}{{ blk|length }}"),
    ("set_block_filter", "{% set x | upper %}abc{% endset %}{{ x }}"),
    ("namespace", "{% set ns = namespace(c=0, items=[]) %}{% for x in l %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }} {{ ns.items }} {{ namespace(d).a }}"),
    ("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}"),
    ("scope_set_after_loop", "{% for i in [1] %}[{{ n }}]{% endfor %}{% set n = 0 %}{{ n }}"),
    ("scope_if_branch_resolve", "{% for i in [1] %}[{{ n }}]{% endfor %}{% if false %}{% set n = 0 %}{% endif %}"),
    ("scope_macro_sees_later_set", "{% macro m() %}{{ n }}{% endmacro %}{{ m() }}{% set n = 1 %}{{ m() }}"),
    ("with_block", "{% with a = 1, b = n %}{{ a }}{{ b }}{% endwith %}{{ a }}"),
    # ---- macros
    ("macro_defaults_kwargs", "{% macro m(a, b='B', c=a ~ '!') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}|{{ m(b=2, a=0) }}"),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}"),
    ("macro_recursive", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}"),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ n }}{% endcall %}"),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each(l) %}[{{ v }}]{% endcall %}"),
    ("filter_block", "{% filter upper %}hello {{ n }}{% endfilter %}"),
    ("generation_block", "A{% generation %}gen {{ n }}{% endgeneration %}B"),
    # ---- filters
    ("f_string_filters", "{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello world-x'|title }}|{{ 'hELLO'|capitalize }}|{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 1) }}|{{ 'a'|center(5) }}|"),
    ("f_length_count", "{{ l|length }} {{ u|length }} {{ d|count }} {{ undefined_var|length }}"),
    ("f_default", "{{ undefined_var|default('dflt') }} {{ e|default('dflt') }} {{ e|default('dflt', true) }} {{ none_v|d('x', boolean=true) }}"),
    ("f_join_list_first_last", "{{ l|join(', ') }} {{ msgs|join('|', attribute='role') }} {{ 'abc'|list }} {{ l|first }} {{ l|last }} {{ []|first }}"),
    ("f_numbers", "{{ -3|abs }} {{ 2.567|round }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.561|round(1, 'floor') }} {{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int(-1) }} {{ '1.5'|float }} {{ 3|float }}"),
    ("f_tojson", "{{ msgs|tojson }}|{{ d|tojson(indent=2) }}|{{ u|tojson }}|{{ 'a\"b\\\\c\\n\\t\\u0001/'|tojson }}|{{ [1.0, 2.5e-7, none, true]|tojson }}|{{ d|tojson(sort_keys=true) }}"),
    ("f_tojson_separators", "{{ d|tojson(separators=(',', ':')) }} {{ u|tojson(ensure_ascii=true) }}"),
    ("f_items_dictsort", "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }}"),
    ("f_map_select", "{{ msgs|map(attribute='role')|list }} {{ l|map('string')|join }} {{ l|select('odd')|list }} {{ l|reject('odd')|list }} {{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|rejectattr('tool_calls')|map(attribute='role')|join(',') }}"),
    ("f_sort_unique", "{{ l|sort }} {{ l|sort(reverse=true) }} {{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ msgs|sort(attribute='role')|map(attribute='role')|list }} {{ ['a', 'A', 'b']|unique|list }}"),
    ("f_min_max_sum", "{{ l|min }} {{ l|max }} {{ l|sum }} {{ msgs|map(attribute='content')|map('length')|sum }} {{ [[1], [2]]|sum(start=[]) }}"),
    ("f_reverse_batch_slice", "{{ l|reverse|list }} {{ 'abc'|reverse }} {{ range(7)|batch(3)|list }} {{ range(7)|batch(3, 'x')|list }} {{ range(7)|slice(3)|list }}"),
    ("f_indent", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('> ', blank=true) }}"),
    ("f_wordcount_truncate", "{{ 'one two, three'|wordcount }} {{ 'the quick brown fox jumps over'|truncate(15) }} {{ 'the quick brown fox'|truncate(10, true, '..', 0) }}"),
    ("f_escape_safe", "{{ '<a href=\"x\">&</a>'|e }} {{ '<b>'|safe }} {{ ('<b>'|safe + '<i>') }} {{ '<x>'|forceescape }}"),
    ("f_format_string", "{{ '%s and %s'|format('a', 'b') }} {{ '%(x)s'|format(x=1) }}"),
    ("f_attr", "{{ d|attr('items') is callable }} {{ d|attr('a') is defined }}"),
    ("f_groupby", "{% for g in msgs|groupby('role') %}{{ g.grouper }}:{{ g.list|length }} {% endfor %}{% for k, items in msgs|groupby('role') %}{{ k }}={{ items|map(attribute='content')|join('/') }};{% endfor %}"),
    ("f_groupby_case_default", "{{ [{'a': 'X', 'b': 1}, {'a': 'x', 'b': 2}, {'a': 'Y', 'b': 3}]|groupby('a') }} {{ [{'a': 'X'}, {'a': 'x'}]|groupby('a', case_sensitive=true) }} {{ [{'a': 1}, {'b': 2}, {'a': 1}]|groupby('a', default=0) }} {{ [[1, 'a'], [0, 'b'], [1, 'c']]|groupby(0)|list }} {{ [{'x': {'y': 2}}, {'x': {'y': 1}}]|groupby('x.y') }} {{ []|groupby('a') }} {{ (msgs|groupby('role'))[0].count('system') }}"),
    ("f_striptags", "{{ '<b>a</b>  <i>b</i>\n c &amp; d'|striptags }}|{{ '<!-- c <b> -->x<br/>y &lt;tag&gt; &#65;&#x42;&#0;&#128;&#1; &quot;q&quot; &nbsp;z'|striptags }}|{{ 'a < b and c > d <unclosed'|striptags }}|{{ '<!<!---->-- x'|striptags }}|{{ 5|striptags }}|{{ 'Main &raquo;\t<em>About</em>'|striptags }}"),
    ("f_striptags_entities", "{{ 'a&b &amp x &ampfoo; &notit; &not &NotEqualTilde; &foo; &copy2 &lt &#39; &#x27 &#xZZ &#1114112; &#55296; &#65534; &#127; &#12; Tom & Jerry &; &#'|striptags }}"),
    ("f_wordwrap", "{{ 'the quick brown fox jumps over the lazy dog'|wordwrap(10) }}|{{ ('lorem ipsum dolor sit amet ' * 8)|wordwrap }}|{{ 'a supercalifragilisticexpialidocious word'|wordwrap(8) }}|{{ 'a supercalifragilisticexpialidocious word'|wordwrap(8, false) }}"),
    ("f_wordwrap_hyphens", "{{ 'well-known state-of-the-art long-hyphenated-words here'|wordwrap(12) }}|{{ 'well-known state-of-the-art long-hyphenated-words here'|wordwrap(12, break_on_hyphens=false) }}|{{ 'this is--perhaps--an em-dash test of wrapping--yes'|wordwrap(9) }}|{{ 'abc-defghijklmnop-qrstuvwxyz'|wordwrap(10) }}|{{ '---------x'|wordwrap(4) }}|{{ '12-34 ab-cd 1a-b2 x-y-z'|wordwrap(4) }}"),
    ("f_wordwrap_lines", "{{ 'first paragraph here\n\nsecond one is a bit longer than that\nthird'|wordwrap(15, wrapstring='<br>') }}|{{ '   leading and    inner   spaces   '|wordwrap(7) }}|{{ u|wordwrap(5) }}|{{ 'a\tb\tc d\te'|wordwrap(3) }}"),
    ("f_urlencode", "{{ 'a b&c/d?\u00e9'|urlencode }} {{ {'a': 1, 'b': 'x y', 'c': none}|urlencode }} {{ [('k', 'v/w'), ('x', '~._-')]|urlencode }} {{ 42|urlencode }} {{ none_v|urlencode }} {{ t|urlencode }} {{ ['ab', 'cd']|urlencode }} {{ undefined_var|urlencode }}"),
    ("f_xmlattr", "{{ {'class': 'x', 'id': 'a\"b', 'n': none, 'u': undefined_var, 'num': 3, 'amp': '<&>', 's': '<b>'|safe}|xmlattr }}|{{ {'a': 1, 'b': 2}|xmlattr(false) }}|{{ {}|xmlattr }}|{{ {'a': none}|xmlattr }}"),
    ("f_filesizeformat", "{{ 1000|filesizeformat }} {{ 123456789|filesizeformat }} {{ 2048|filesizeformat(true) }} {{ 1|filesizeformat }} {{ 0|filesizeformat }} {{ 999|filesizeformat }} {{ -5000|filesizeformat }} {{ '1500'|filesizeformat }} {{ 1.5|filesizeformat }} {{ 1e30|filesizeformat }} {{ 1e20|filesizeformat(true) }} {{ 999999|filesizeformat }}"),
    ("f_pprint", "{{ d|pprint }} {{ l|pprint }} {{ msgs[0]|pprint }} {{ 'it\\'s'|pprint }} {{ none_v|pprint }} {{ (1,)|pprint }} {{ {2: 'b', 1: [{'z': 1, 'a': 2}]}|pprint }}"),
    ("is_filter_test", "{{ 'groupby' is filter }} {{ 'random' is filter }} {{ 'from_json' is filter }} {{ 'nosuchtest' is test }} {% if 'from_json' is filter %}{{ '{}'|from_json }}{% else %}no{% endif %}"),
    # ---- unknown filters and tests: jinja2 3.x checks them when it compiles,
    # except under an if statement or a conditional expression (a "soft"
    # frame), where one fails only when evaluated
    ("unk_if_false", "{% if false %}{{ n|nosuch }}{% endif %}ok"),
    ("unk_tool_args_branch", "{% for m in msgs %}{% if m.content is string %}{{ m.content }}{% else %}{{ m.content|from_json }}{% endif %}{% endfor %}"),
    ("unk_if_test_short", "{% if false and n|nosuch %}a{% endif %}ok"),
    ("unk_elif_else", "{% if true %}a{% elif n|nosuch %}b{% else %}{{ n|nosuch2 }}{% endif %}ok"),
    ("unk_condexpr", "{{ (n|nosuch) if false else 1 }} {{ 1 if false and n|nosuch else 2 }}"),
    ("unk_for_iter_in_if", "{% if false %}{% for i in l|nosuch %}{% endfor %}{% endif %}ok"),
    ("unk_if_in_for_macro", "{% for i in l %}{% if false %}{{ i|nosuch }}{% endif %}{% endfor %}{% macro m() %}{% if false %}{{ 1|nosuch }}{% endif %}{% endmacro %}{{ m() }}ok"),
    ("unk_in_if_statements", "{% macro m(a) %}{{ caller() }}{% endmacro %}{% if false %}{% set a = 1|nosuch %}{% with b = 1|nosuch %}x{% endwith %}{% print 1|nosuch %}{% call m(1|nosuch) %}x{% endcall %}{% endif %}ok"),
    ("unk_nested_if_dict", "{% if true %}{% if false %}{{ {'a': 1|nosuch} }}{% endif %}{% endif %}ok"),
    ("unk_test_if_false", "{% if false %}{{ 1 is nosuchtest }}{% endif %}ok"),
    ("err_unk_if_true", "{% if true %}{{ n|nosuch }}{% endif %}"),
    ("err_unk_if_test", "{% if n|nosuch %}a{% endif %}"),
    ("err_unk_test_evaluated", "{% if n is nosuchtest %}{% endif %}"),
    ("err_unk_args_first", "{% if true %}{{ 1|nosuch(undefined_var.x) }}{% endif %}"),
    ("err_unk_undefined_value", "{% if true %}{{ undefined_var|nosuch }}{% endif %}"),
    ("err_unk_for_in_if", "{% if false %}{% for i in l %}{{ i|nosuch }}{% endfor %}{% endif %}"),
    ("err_unk_for_filter_in_if", "{% if false %}{% for i in l if i|nosuch %}{% endfor %}{% endif %}"),
    ("err_unk_for_else_in_if", "{% if false %}{% for i in l %}{% else %}{{ 1|nosuch }}{% endfor %}{% endif %}"),
    ("err_unk_macro_default_in_if", "{% if false %}{% macro m(a=1|nosuch) %}{% endmacro %}{% endif %}"),
    ("err_unk_set_block_in_if", "{% if false %}{% set a %}{{ 1|nosuch }}{% endset %}{% endif %}"),
    ("err_unk_set_block_filter_in_if", "{% if false %}{% set a | nosuch %}x{% endset %}{% endif %}"),
    ("err_unk_filter_block_in_if", "{% if false %}{% filter nosuch %}x{% endfilter %}{% endif %}"),
    ("err_unk_with_body_in_if", "{% if false %}{% with a = 1 %}{{ a|nosuch }}{% endwith %}{% endif %}"),
    ("err_unk_call_body_in_if", "{% macro m() %}{{ caller() }}{% endmacro %}{% if false %}{% call m() %}{{ 1|nosuch }}{% endcall %}{% endif %}"),
    ("err_unk_call_default_in_if", "{% macro m() %}{{ caller() }}{% endmacro %}{% if false %}{% call(a=1|nosuch) m() %}x{% endcall %}{% endif %}"),
    ("err_unk_generation_in_if", "{% if false %}{% generation %}{{ 1|nosuch }}{% endgeneration %}{% endif %}"),
    ("err_unk_test_top", "{{ 1 is nosuchtest }}"),
    ("err_unk_first_in_order", "{{ 1 is nosucht }}{{ 1|nosuchf }}"),
    ("err_unk_after_syntax", "{{ 1|nosuch }}{{ 1 + }}"),
    # ---- tests
    ("tests_types", "{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 'a' is string }}{{ d is mapping }}{{ l is sequence }}{{ l is iterable }}{{ none_v is none }}{{ undefined_var is defined }}{{ undefined_var is undefined }}{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}"),
    ("tests_compare", "{{ 1 is eq 1 }}{{ 'a' is equalto 'a' }}{{ 2 is gt 1 }}{{ 2 is lt 1 }}{{ 2 is ge 2 }}{{ 2 is le 1 }}{{ 2 is ne 1 }}{{ 'a' is in 'abc' }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ none_v is sameas none }}{{ t is true }}{{ t is false }}"),
    ("tests_negated", "{{ 1 is not string }} {{ d.x is not defined }} {{ not n is even }}"),
    # ---- string methods
    ("m_strip_split", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}"),
    ("m_case_find", "{{ u.upper() }}|{{ u.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aBc'.swapcase() }}|{{ s.find('World') }}|{{ s.count('l') }}|{{ 'abc'.replace('', '-') }}"),
    ("m_startswith", "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.startswith('l', 2) }}"),
    ("m_misc", "{{ '42'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ '5'.zfill(3) }}|{{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}|{{ 'ab'.center(6, '*') }}|{{ 'a=b=c'.partition('=') }}|{{ 'pre_x'.removeprefix('pre_') }}|{{ ', '.join(['x', 'y']) }}|{{ 'a\nb\r\nc'.splitlines() }}"),
    ("m_format", "{{ '{} {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<4}|{:^6}|{:.2f}|{:03d}'.format('r', 'l', 'c', 3.14159, 7) }}"),
    ("list_methods", "{{ l.index(1) }} {{ l.count(3) }} {{ [1, 1].count(1) }}"),
    # ---- globals
    ("globals", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(3) }} {{ dict(a=1, b=[2]) }} {% set j = joiner('+') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}"),
    ("strftime_now_pinned", "{{ strftime_now('%Y-%m-%d %H:%M %b %A') }}"),
    # ---- errors jinja2 raises
    ("err_raise_exception", "{{ raise_exception('Bad role: ' ~ msgs[0].role) }}"),
    ("err_undefined_attr", "{{ undefined_var.attr }}"),
    ("err_missing_element", "{{ msgs[10].role }}"),
    ("err_str_plus_int", "{{ 'a' + 1 }}"),
    ("err_int_plus_str", "{{ 1 + 'a' }}"),
    ("err_div_zero", "{{ 1 / 0 }}"),
    ("err_not_iterable", "{% for x in n %}{% endfor %}"),
    ("err_unsafe_append", "{{ l.append(4) }}"),
    ("err_macro_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
    ("err_unknown_filter", "{{ n|nosuchfilter }}"),
    ("err_unknown_tag", "{% nosuchtag %}"),
    ("err_unclosed_block", "{% if t %}x"),
    ("err_syntax", "{{ 1 + }}"),
    ("err_unexpected_char", "{{ 1 ! 2 }}"),
    ("err_tojson_undefined", "{{ undefined_var|tojson }}"),
    ("err_unpack", "{% for a, b in [1] %}{% endfor %}"),
    ("err_range_too_big", "{{ range(200000)|length }}"),
]


def c_str(s):
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif 32 <= b < 127 and c != "?":
            out.append(c)
        else:
            out.append(f'\\{b:03o}')
    return '"' + "".join(out) + '"'


def main():
    os.environ["SOURCE_DATE_EPOCH"] = "1735689600"
    os.environ["TZ"] = "UTC"
    import time
    time.tzset()
    ctx_json = json.dumps(CTX, ensure_ascii=False)
    lines = ["/* Generated by scripts/gen_tmpl_cases.py from Python's jinja2 (configured as",
             " * transformers does); do not edit. Each case: the template, and either the",
             " * exact output or a message the error must contain. */",
             f"static const char tmpl_case_context[] = {c_str(ctx_json)};",
             "static const struct { const char *name, *src, *out, *err; size_t out_len; } tmpl_cases[] = {"]
    for name, src in CASES:
        ok, res = jinja_ref.render(src, dict(CTX))
        if ok:
            lines.append(f"    {{{c_str(name)}, {c_str(src)}, {c_str(res)}, NULL, {len(res.encode('utf-8'))}}},")
        else:
            msg = res.split(": ", 1)[1] if ": " in res else res
            msg = msg.split("\n")[0]
            lines.append(f"    {{{c_str(name)}, {c_str(src)}, NULL, {c_str(msg)}, 0}},")
    lines.append("};")
    path = os.path.join(HERE, "..", "tests", "unit", "tmpl_cases.h")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(CASES)} cases to {path}")


if __name__ == "__main__":
    main()
