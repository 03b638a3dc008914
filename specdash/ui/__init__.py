"""The dashboard: the only package that imports Textual (app, widgets), plus its
event sources and the event-folding model behind the panels."""
