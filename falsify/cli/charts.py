"""The PNG line charts live in falsify/llm/charts.py (the library writes GRPO's reward curve);
the CLI's verbs (`falsify parity --plot`) use them from here."""

from falsify.llm.charts import figure, line_chart  # noqa: F401
