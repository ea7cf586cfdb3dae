"""Language ID: accuracy on a labeled multilingual sample, and the langid step's filtering."""

from lmforge.data.documents import Document
from lmforge.data.langid import identify
from lmforge.data.pipeline.steps import LangId

SAMPLE = {
    "en": [
        "The library opens at nine in the morning and closes late on Thursdays.",
        "She walked along the river while the rain slowly stopped.",
        "Please send me the report before the meeting tomorrow afternoon.",
    ],
    "de": [
        "Die Bibliothek öffnet um neun Uhr morgens und schließt donnerstags spät.",
        "Sie ging am Fluss entlang, während der Regen langsam aufhörte.",
        "Bitte schicken Sie mir den Bericht vor der Besprechung morgen Nachmittag.",
    ],
    "fr": [
        "La bibliothèque ouvre à neuf heures du matin et ferme tard le jeudi.",
        "Elle marchait le long de la rivière pendant que la pluie cessait lentement.",
        "Merci de m'envoyer le rapport avant la réunion de demain après-midi.",
    ],
    "es": [
        "La biblioteca abre a las nueve de la mañana y cierra tarde los jueves.",
        "Ella caminaba junto al río mientras la lluvia se detenía poco a poco.",
        "Por favor, envíame el informe antes de la reunión de mañana por la tarde.",
    ],
    "it": [
        "La biblioteca apre alle nove del mattino e chiude tardi il giovedì.",
        "Camminava lungo il fiume mentre la pioggia smetteva lentamente.",
        "Per favore, mandami la relazione prima della riunione di domani pomeriggio.",
    ],
    "pt": [
        "A biblioteca abre às nove da manhã e fecha tarde às quintas-feiras.",
        "Ela caminhava ao longo do rio enquanto a chuva parava devagar.",
        "Por favor, envie-me o relatório antes da reunião de amanhã à tarde.",
    ],
    "nl": [
        "De bibliotheek gaat om negen uur 's ochtends open en sluit op donderdag laat.",
        "Ze liep langs de rivier terwijl de regen langzaam ophield.",
        "Stuur me alsjeblieft het verslag voor de vergadering van morgenmiddag.",
    ],
    "ru": [
        "Библиотека открывается в девять утра и закрывается поздно по четвергам.",
        "Она шла вдоль реки, пока дождь медленно прекращался.",
        "Пожалуйста, пришлите мне отчёт до завтрашнего совещания.",
    ],
    "pl": [
        "Biblioteka otwiera się o dziewiątej rano i zamyka późno w czwartki.",
        "Szła wzdłuż rzeki, podczas gdy deszcz powoli ustawał.",
        "Proszę przesłać mi raport przed jutrzejszym spotkaniem po południu.",
    ],
    "tr": [
        "Kütüphane sabah dokuzda açılır ve perşembe günleri geç kapanır.",
        "Yağmur yavaşça dinerken nehir boyunca yürüdü.",
        "Lütfen raporu yarın öğleden sonraki toplantıdan önce bana gönderin.",
    ],
    "ja": [
        "図書館は朝九時に開き、木曜日は遅くまで開いています。",
        "雨がゆっくりと止む間、彼女は川沿いを歩いた。",
        "明日の午後の会議の前に報告書を送ってください。",
    ],
    "zh": [
        "图书馆早上九点开门，星期四关门很晚。",
        "雨慢慢停下来的时候，她沿着河边散步。",
        "请在明天下午开会之前把报告发给我。",
    ],
    "ar": [
        "تفتح المكتبة في التاسعة صباحا وتغلق متأخرة يوم الخميس.",
        "كانت تمشي على طول النهر بينما توقف المطر ببطء.",
        "من فضلك أرسل لي التقرير قبل اجتماع الغد بعد الظهر.",
    ],
}


def test_language_id_is_accurate_on_a_labeled_sample_of_13_languages():
    results = [(lang, identify(text)) for lang, texts in SAMPLE.items() for text in texts]
    correct = [lang == got for lang, (got, _) in results]
    assert len(SAMPLE) >= 10
    assert sum(correct) / len(correct) >= 0.95, [
        r for r, ok in zip(results, correct, strict=True) if not ok
    ]
    confident = [conf for lang, (got, conf) in results if lang == got]
    assert all(0.0 <= c <= 1.0 for c in confident) and sum(confident) / len(confident) > 0.8


def test_langid_step_keeps_listed_languages_and_labels_documents():
    step = LangId(LangId.Config(languages=["en", "de"], min_confidence=0.5))
    docs = [
        Document(f"{lang}{i}", t) for lang, texts in SAMPLE.items() for i, t in enumerate(texts)
    ]
    docs.append(Document("code", "def f(x):\n    return x\n", {"format": "code"}))
    kept = list(step(docs))
    assert {d.id[:2] for d in kept} == {"en", "de", "co"}
    assert kept[0].meta["lang"] == "en" and kept[0].meta["lang_confidence"] > 0.5
    assert step.stats.removed["langid_not_en_de"] >= 30
    assert step.stats.counters["lang_fr"] == 3
