from django.contrib import admin

from .models import LogRun, Report

admin.site.register(Report)


@admin.register(LogRun)
class LogRunAdmin(admin.ModelAdmin):
    list_display = ["name", "lines", "failed_chunks", "created_at", "finished_at", "group_id"]
