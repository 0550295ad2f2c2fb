// The Jinja interpreter on the language features chat templates use, each snippet rendered by
// Python's jinja2 too (the Hugging Face chat environment) and compared byte for byte; then the
// limits and the refusal of constructs it does not implement.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <span>

#include "generate/jinja_template.h"
#include "jinja2_reference.h"

namespace rl {
namespace {

using ojson = nlohmann::ordered_json;
using jinja::JinjaError;
using jinja::JinjaTemplate;

// Snippets, one feature each (whitespace control, scoping, loop.*, namespace, macros, filters,
// tests, str/dict methods, slicing, Python's str() of values).
const char* kSnippets[] = {
    "{{ 'a' }}  {{- ' b ' -}}  {{ 'c' }}\n",
    "x\n  {% if true %}\n  yes\n  {% endif %}\nz\n",
    "  {%+ if true %}keep{% endif %}\n{% if true -%}   \n  trimmed{%- endif %}",
    "{# comment #}\n  {#- c2 -#}  after",
    "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
    "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}",
    "{% for m in msgs %}{% if loop.previtem is defined %}{{ loop.previtem.role }}{% endif %}>{{ m.role }}<"
    "{% if loop.nextitem %}{{ loop.nextitem.role }}{% endif %};{% endfor %}",
    "{% for m in msgs if m.role != 'tool' %}{{ loop.index }}{{ m.role }}{{ loop.last }} {% else %}none{% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for m in msgs %}{% if m.role == 'tool' %}{% break %}{% endif %}{{ m.role }}{% endfor %}",
    "{% for m in msgs %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
    "{% for m in msgs %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% set x = 1 %}{% for m in msgs %}{% set x = x + 1 %}{{ x }}{% endfor %}:{{ x }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in msgs %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}"
    "{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% macro tag(name, body='none', close=true) %}<{{ name }}>{{ body }}{% if close %}</{{ name }}>{% endif %}"
    "{% endmacro %}{{ tag('a') }}{{ tag('b', 'x') }}{{ tag('c', close=false) }}",
    "{% macro outer(d) %}{% for k, v in d|items %}[{{ k }}={% if v is mapping %}{{ outer(v) }}{% else %}{{ v }}"
    "{% endif %}]{% endfor %}{% endmacro %}{{ outer(obj) }}",
    "{% set b %}inner {{ 1 + 2 }}{% endset %}[{{ b }}]",
    "{{ obj | tojson }}|{{ obj.list | tojson }}|{{ 'é\"\\n' | tojson }}|{{ 1.5 | tojson }}|{{ none | tojson }}",
    "{{ obj | tojson(indent=2) }}",
    "{{ '  x y  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ obj | length }}|{{ 'héllo' | length }}|{{ obj.list | count }}",
    "{{ obj.list | join(', ') }}|{{ obj.list | first }}|{{ obj.list | last }}|{{ obj | list }}",
    "{{ msgs | map(attribute='role') | join(',') }}|{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}"
    "|{{ msgs | rejectattr('role', 'in', ['user', 'tool']) | map(attribute='role') | list }}",
    "{{ undefined_var | default('dflt') }}|{{ '' | default('e', true) }}|{{ 3 | string }}{{ true | string }}",
    "{{ 'Hello World' | lower }} {{ 'hi' | upper }} {{ 'hello world' | title }} {{ 'hELLO' | capitalize }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ '7' | int + 1 }} {{ '2.5' | float }} {{ -3 | abs }} {{ [3, 1, 2] | sort }}",
    "{{ [1, 2, 2, 3] | unique | list }} {{ 'abc' | reverse }} {{ obj | dictsort }} {{ [1, 2, 3] | sum }}",
    "{{ 'line1\\nline2\\n\\nline4' | indent(2) }}|{{ 'a\\nb' | indent(3, true) }}",
    "{{ x is defined }} {{ obj is mapping }} {{ obj.list is sequence }} {{ 'x' is string }} {{ 1 is number }}"
    " {{ none is none }} {{ obj.list is iterable }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ true is sameas true }}"
    " {{ 1.0 is float }} {{ 1 is integer }} {{ true is boolean }} {{ 'abc' is lower }} {{ x is not defined }}",
    "{{ 'a<b>c'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ '  s  '.strip() }}| {{ 'xxsxx'.lstrip('x') }}"
    " {{ 'xxsxx'.rstrip('x') }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}"
    " {{ 'a,b,c'.rsplit(',', 1) }} {{ 'abcb'.find('b') }} {{ 'abcb'.rfind('b') }} {{ 'abcb'.count('b') }}",
    "{{ '-'.join(['a', 'b']) }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'x y'.title() }} {{ 'a\\nb'.splitlines() }}"
    " {{ 'aXbX'.replace('X', '') }} {{ '12'.isdigit() }} {{ 'pre_x'.removeprefix('pre_') }}",
    "{{ obj.get('num') }} {{ obj.get('missing', 'd') }} {{ obj.get('missing') }} {{ obj.keys() | list }}"
    " {% for k, v in obj.items() %}{{ k }}{% endfor %} {{ obj.values() | list | length }}",
    "{{ msgs[0].role }} {{ msgs[-1]['role'] }} {{ msgs[1:] | length }} {{ msgs[::-1][0].role }} {{ 'hello'[1:3] }}"
    " {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ msgs[10] is defined }}",
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 'ab' * 3 }}"
    " {{ [1] + [2] }} {{ 1 ~ 'x' ~ none }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 10 / 4 }} {{ 3.0 }}",
    "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }} {{ 'b' in 'abc' }} {{ 'k' not in obj }}"
    " {{ 2 in [1, 2] }} {{ not 0 }} {{ 0 or 'x' }} {{ 'y' and 'z' }} {{ none or [] }}",
    "{{ 'yes' if obj.num > 3 else 'no' }} {{ 'only' if false }}|{{ obj.list[1] if obj.list else '' }}",
    "{{ none }} {{ true }} {{ obj.list }} {{ obj }} {{ {'a': [1, 'x', none, false]} }} {{ (1, 2) }} {{ \"it's\" }}"
    " {{ ['it\\'s', 'q\"'] }}",
    "{% raw %}{{ not rendered }} {% if %}{% endraw %} after",
    "{{ 'a' 'b' }}{{ \"\\u00e9\\t|\" }}{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ dict(a=1, b=2) }}",
    "{% filter upper %}shout {{ 'this' }}{% endfilter %}",
    "{%- for tool in tools %}{{ tool.function.name }}:{% for p, f in tool.function.parameters.properties | items %}"
    "{{ p }}({{ f.type }}){% endfor %};{% endfor %}",
};

ojson snippet_context() {
  return ojson::parse(R"({
    "msgs": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
             {"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}],
    "obj": {"num": 5, "name": "Zoë", "list": [3, "two", 1.5, true, null], "nested": {"k": [1, {"z": 2}]}},
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
               "properties": {"unit": {"type": "string"}, "city": {"type": "string"}}}}}]
  })");
}

// jinja2's results for template sources given as text (each written to a scratch file).
std::vector<test::Jinja2Result> jinja2_results(std::span<const char* const> sources) {
  std::vector<test::Jinja2Case> cases;
  std::vector<std::string> paths;
  for (size_t k = 0; k < sources.size(); ++k) {
    paths.push_back(test::temp_path("jinja-snippets", "s" + std::to_string(k) + ".jinja"));
    std::ofstream(paths.back(), std::ios::binary) << sources[k];
    cases.push_back({paths.back(), snippet_context()});
  }
  auto results = test::render_with_jinja2(cases);
  for (auto& p : paths) test::remove_temp(p);
  return results;
}

TEST(JinjaInterpreter, SnippetsRenderAsJinja2Does) {
  const auto expected = jinja2_results(kSnippets);
  ASSERT_EQ(expected.size(), std::size(kSnippets));
  for (size_t k = 0; k < expected.size(); ++k) {
    SCOPED_TRACE(kSnippets[k]);
    ASSERT_TRUE(expected[k].ok) << "jinja2: " << expected[k].text;
    std::string got;
    try {
      got = JinjaTemplate::parse(kSnippets[k]).render(snippet_context());
    } catch (const JinjaError& e) {
      got = std::string("error: ") + e.what();
    }
    EXPECT_EQ(got, expected[k].text);
  }
}

TEST(JinjaInterpreter, TemplateErrorsAreErrorsAsInJinja2) {
  // Each fails in jinja2 too (checked below), so the interpreter must not render them.
  const char* failing[] = {
      "{{ raise_exception('System message must be at the beginning.') }}",
      "{{ nothing.attr }}",
      "{{ 'a' + 1 }}",
      "{{ obj.list.append(1) }}",
      "{% set x = 1 %}{% set x.y = 2 %}",
      "{{ 1 // 0 }}",
      "{{ 5 | items | list }}",
      "{{ none | length }}",
  };
  const auto expected = jinja2_results(failing);
  ASSERT_EQ(expected.size(), std::size(failing));
  for (size_t k = 0; k < expected.size(); ++k) {
    SCOPED_TRACE(failing[k]);
    EXPECT_FALSE(expected[k].ok);
    try {
      JinjaTemplate::parse(failing[k]).render(snippet_context());
      ADD_FAILURE() << "rendered without an error";
    } catch (const JinjaError& e) {
      EXPECT_FALSE(e.unsupported) << e.what();
    }
  }
  try {
    JinjaTemplate::parse(failing[0]).render(snippet_context());
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("System message must be at the beginning."), std::string::npos);
  }
}

TEST(JinjaInterpreter, UnsupportedConstructsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% include 'other.jinja' %}", "include"},
      {"{% extends 'base' %}", "extends"},
      {"{% for x in y recursive %}{% endfor %}", "recursive"},
      {"{{ x | wordwrap }}", "wordwrap"},
      {"{{ x is escaped }}", "escaped"},
      {"{% call m() %}{% endcall %}", "call"},
      {"{{ '%s' % 'x' }}", "string formatting"},
      {"{{ 'x'.format(1) }}", "format"},
      {"{{ 'x'.zfill(3) }}", "zfill"},
  };
  for (auto& [src, name] : cases) {
    SCOPED_TRACE(src);
    try {
      JinjaTemplate::parse(src).render(ojson::object());
      ADD_FAILURE() << "no error";
    } catch (const JinjaError& e) {
      EXPECT_TRUE(e.unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(JinjaInterpreter, SyntaxErrorsNameTheLine) {
  const char* bad[] = {"line1\n{% if x %}never closed", "a\nb\n{{ 1 + }}", "{% endfor %}", "{{ 'open }}",
                       "{% for x in %}{% endfor %}", "{{ x"};
  for (const char* src : bad) {
    SCOPED_TRACE(src);
    try {
      JinjaTemplate::parse(src);
      ADD_FAILURE() << "parsed";
    } catch (const JinjaError& e) {
      EXPECT_FALSE(e.unsupported);
      EXPECT_NE(std::string(e.what()).find("line"), std::string::npos) << e.what();
    }
  }
}

TEST(JinjaInterpreter, NestingDepthIsBounded) {
  // Parsing: 200 nested parentheses and 200 nested ifs exceed kMaxNestingDepth.
  std::string parens = "{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}";
  std::string ifs;
  for (int k = 0; k < 200; ++k) ifs += "{% if true %}";
  for (int k = 0; k < 200; ++k) ifs += "{% endif %}";
  for (const std::string& src : {parens, ifs}) {
    try {
      JinjaTemplate::parse(src);
      ADD_FAILURE() << "parsed";
    } catch (const JinjaError& e) {
      EXPECT_NE(std::string(e.what()).find("nesting deeper than 64"), std::string::npos) << e.what();
    }
  }
  // A flat chain of operators nests the parsed tree too: bounded at kMaxChainLength (256).
  std::string chain = "{{ 1";
  for (int k = 0; k < 300; ++k) chain += " ~ 1";
  try {
    JinjaTemplate::parse(chain + " }}");
    ADD_FAILURE() << "parsed";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 256"), std::string::npos) << e.what();
  }
  // A tree deeper than kMaxExpressionDepth (256) is refused, however it is built.
  std::string tall = "{{ " + std::string(8, '(') + "1";  // ((((1 + 1 ...) + 1 ...) ...): 8 x 40 levels
  for (int k = 0; k < 8; ++k) {
    for (int j = 0; j < 40; ++j) tall += " + 1";
    tall += ")";
  }
  tall += " }}";
  try {
    JinjaTemplate::parse(tall);
    ADD_FAILURE() << "parsed";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than 256"), std::string::npos) << e.what();
  }
  // A 200-level expression inside a macro recursing as deep as evaluation allows: a clean error
  // at kMaxEvalDepth (512), not a stack overflow.
  std::string sum = "n";
  for (int k = 0; k < 200; ++k) sum += " + 0";
  try {
    JinjaTemplate::parse("{% macro f(n) %}{{ f(" + sum + " + 1) }}{% endmacro %}{{ f(0) }}").render(ojson::object());
    ADD_FAILURE() << "rendered";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than"), std::string::npos) << e.what();
  }
  // Within the bound it parses and renders.
  std::string ok = "{{ " + std::string(20, '(') + "1" + std::string(20, ')') + " }}";
  EXPECT_EQ(JinjaTemplate::parse(ok).render(ojson::object()), "1");
  // Rendering: a macro that calls itself without end stops at the call-depth limit.
  try {
    JinjaTemplate::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").render(ojson::object());
    ADD_FAILURE() << "rendered";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than 64"), std::string::npos) << e.what();
  }
}

TEST(JinjaInterpreter, TimeAndSizeAreBounded) {
  jinja::RenderLimits fast;
  fast.time_budget = std::chrono::milliseconds(50);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    JinjaTemplate::parse("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
        .render(ojson::object(), fast);
    ADD_FAILURE() << "rendered";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("longer than 50 ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  jinja::RenderLimits small;
  small.max_output_bytes = 1000;
  try {
    JinjaTemplate::parse("{{ 'x' * 5000 }}").render(ojson::object(), small);
    ADD_FAILURE() << "rendered";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("larger than 1000 bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rl
