"""Views: one plotting function per figure (reading records only) and the ipywidgets trajectory browser."""
