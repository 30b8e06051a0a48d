"""The studies, one folder each: how it runs (`run`), its tables, figures and paper section."""
