from django.contrib import admin
from django.urls import path

from shop import views

urlpatterns = [
    path("", views.index, name="index"),
    path("signup/", views.signup, name="signup"),
    path("reports/", views.request_report, name="request-report"),
    path("tidy/", views.tidy, name="tidy"),
    path("imports/", views.start_imports, name="start-imports"),
    path("jobs/<str:job_id>/", views.job_status, name="job-status"),
    path("logs/", views.log_runs, name="log-runs"),
    path("logs/upload/", views.upload_log, name="upload-log"),
    path("logs/sample/", views.generate_log, name="generate-log"),
    path("logs/<int:run_id>/", views.log_run, name="log-run"),
    path("admin/", admin.site.urls),
]
