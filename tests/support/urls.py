from django.contrib import admin
from django.urls import path

from django_redisqueue.views import metrics

urlpatterns = [path("admin/", admin.site.urls), path("metrics", metrics)]
