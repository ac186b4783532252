"""Fire drills at run time: a drilled node judged as if the condition were real."""
