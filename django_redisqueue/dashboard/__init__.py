"""The admin dashboard's reads and the rows its templates show (its views are the
app's ``admin.py``)."""
